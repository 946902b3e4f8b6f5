"""The PCN layout on disk: the taxonomy file and the .pcd clouds, read and written.

    <root>/PCN.json                                  taxonomy and splits
    <root>/{train,val,test}/complete/<synset>/<model>.pcd      the complete cloud (PCN: 16,384 points)
    <root>/{train,val,test}/partial/<synset>/<model>/NN.pcd    partial views 00, 01, ... (PCN: 8 in train, 1 else)

PCN.json is a list of categories, `{"taxonomy_id": "02691156", "taxonomy_name": "airplane",
"train": [model ids], "val": [...], "test": [...]}`. Clouds are read and written with
open3d. The data module (data.py) reads this layout and the default-shapes builder
(shapes.py) writes it.
"""

import json
from pathlib import Path

import numpy as np

from ...errors import DataError
from ...open3d import load as load_open3d

SPLITS = ("train", "val", "test")
TAXONOMY_FILE = "PCN.json"
HEADER_LINES = 12  # a PCD v0.7 header: VERSION ... DATA, plus a comment line


def read_pcd(path: Path) -> np.ndarray:
    """The points of a .pcd file, [N, 3] float32; DataError naming the file when it is
    missing, unreadable or empty."""
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    o3d = load_open3d()
    with o3d.utility.VerbosityContextManager(o3d.utility.VerbosityLevel.Error):
        cloud = o3d.io.read_point_cloud(str(path), format="pcd")
    points = np.asarray(cloud.points, dtype=np.float32)
    if len(points) == 0:
        raise DataError(f"{path}: no points read (an empty or unreadable PCD file)")
    return points


def write_pcd(path: Path, points: np.ndarray) -> None:
    """Write points [N, 3] as a binary .pcd through open3d; a reader never sees half a
    file (written to a temporary name beside it, then renamed)."""
    o3d = load_open3d()
    cloud = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(np.asarray(points, dtype=np.float64)))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.pcd")
    if not o3d.io.write_point_cloud(str(tmp), cloud):
        raise OSError(f"{path}: open3d could not write the file")
    tmp.replace(path)


def pcd_point_count(path: Path) -> int:
    """The POINTS of a .pcd file's header; DataError naming the file when it is missing,
    has no PCD header, lacks x y z fields or holds no points."""
    try:
        with open(path, "rb") as f:
            lines = []
            while len(lines) < HEADER_LINES and (not lines or lines[-1][:1] != ["DATA"]):
                lines.append(f.readline(256).decode("ascii", "replace").split())
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as err:
        raise DataError(f"{path}: unreadable ({err.strerror})") from None
    header = {line[0].upper(): line[1:] for line in lines if line and not line[0].startswith("#")}
    if "POINTS" not in header or "DATA" not in header:
        raise DataError(f"{path}: not a PCD file (no POINTS / DATA header lines)")
    if not {"x", "y", "z"} <= set(header.get("FIELDS", [])):
        raise DataError(f"{path}: the PCD fields are {' '.join(header.get('FIELDS', []))}, not x y z ...")
    try:
        count = int(header["POINTS"][0])
    except (IndexError, ValueError):
        raise DataError(f"{path}: POINTS {' '.join(header['POINTS'])} is not a number") from None
    if count < 1:
        raise DataError(f"{path}: an empty cloud (POINTS {count})")
    return count


def read_taxonomy(root: Path) -> list[dict]:
    """PCN.json, checked: a list of {taxonomy_id, taxonomy_name, train, val, test}."""
    path = root / TAXONOMY_FILE
    if not path.is_file():
        raise DataError(f"{path}: no such file; data.path must be a folder in the PCN layout")
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(entries, list) or not entries:
        raise DataError(f"{path}: expected a non-empty list of categories")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("taxonomy_id"), str):
            raise DataError(f"{path}: entry {i} has no taxonomy_id string")
        for split in SPLITS:
            models = entry.get(split, [])
            if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
                raise DataError(f"{path}: entry {i} ({entry['taxonomy_id']}): {split!r} must be a list of model ids")
    return entries
