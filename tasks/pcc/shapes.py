"""The embedded default dataset: open3d's mesh primitives, written in the PCN layout.

Each category is one primitive (box, sphere, cylinder, cone, torus, icosahedron, mobius
strip, arrow); each model is that primitive with random proportions, a random rotation
and a random anisotropic scaling (each axis by a factor in [0.5, 1.5]), then centred on
its bounding box and scaled so that its farthest vertex is 0.5 from the origin: inside
the sphere of diameter 1, the scale of PCN's ShapeNet objects, so the F-score's absolute
threshold 0.01 means the same here.

- complete cloud: `COMPLETE_POINTS` points sampled uniformly from the surface (by area).
  The surfaces average 1.2 in area, so 8,192 points put a point of the surface within
  the F-score's 0.01 of a true point with probability about 1 - exp(-8192 pi 0.01^2 / 1.2)
  = 0.88 (PCN's 16,384 points on its objects are about as dense); with fewer, the F-score
  counts chance coincidences with the truth's samples. 8,192 rather than 16,384 keeps the
  folder at 44 MB;
- partial view: `VIEW_SOURCE_POINTS` other uniform surface points, of which those visible
  from a random viewpoint (a random direction at distance `VIEW_DISTANCE`) are kept,
  through open3d's hidden point removal; 8 views per model in train, 1 in val and test,
  as in PCN. The views are sampled apart from the complete cloud, so a partial point is
  not a point of the truth (as in PCN, whose views are back-projected depth images).

The data depend only on `recipe()` (`DATA_SEED` and the sizes, not the run's seed), and
are built once per machine into the default-data cache (lavo_tasks.default_data).
"""

import json
from importlib.metadata import version
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ...open3d import load as load_open3d
from .pcn import TAXONOMY_FILE, write_pcd

DATA_SEED = 2017
COMPLETE_POINTS = 8192
VIEW_SOURCE_POINTS = 1536
VIEW_DISTANCE = 3.0
RADIUS = 0.5
MODELS = {"train": 25, "val": 4, "test": 6}  # per category
VIEWS = {"train": 8, "val": 1, "test": 1}
BUILDER_VERSION = 2  # raise it when what write_default_dataset writes changes


def recipe() -> dict:
    """What the default shapes depend on: this builder's version and sizes, and the
    open3d and numpy that sample them."""
    return {"builder": "pcc.shapes", "version": BUILDER_VERSION, "seed": DATA_SEED,
            "complete_points": COMPLETE_POINTS, "view_source_points": VIEW_SOURCE_POINTS,
            "view_distance": VIEW_DISTANCE, "radius": RADIUS, "models": MODELS, "views": VIEWS,
            "open3d": version("open3d"), "numpy": np.__version__}


def _primitives(o3d, rng: np.random.Generator) -> dict:
    """name -> a function making one mesh of that primitive with random proportions."""
    mesh = o3d.geometry.TriangleMesh
    u = rng.uniform
    return {
        "box": lambda: mesh.create_box(u(0.5, 1.5), u(0.5, 1.5), u(0.5, 1.5)),
        "sphere": lambda: mesh.create_sphere(1.0, resolution=20),
        "cylinder": lambda: mesh.create_cylinder(u(0.3, 1.0), u(1.0, 3.0), resolution=30),
        "cone": lambda: mesh.create_cone(u(0.5, 1.2), u(1.0, 3.0), resolution=30),
        "torus": lambda: mesh.create_torus(1.0, u(0.15, 0.5), radial_resolution=40, tubular_resolution=20),
        "icosahedron": lambda: mesh.create_icosahedron(1.0),
        "mobius": lambda: mesh.create_mobius(length_split=80, width_split=10, twists=int(rng.integers(1, 4)),
                                             width=u(0.5, 1.0)),
        "arrow": lambda: mesh.create_arrow(u(0.1, 0.3), u(0.3, 0.6), u(1.0, 2.0), u(0.5, 1.0), resolution=30),
    }


def _random_rotation(rng: np.random.Generator) -> np.ndarray:
    """[3, 3]: uniform over rotations (a normalised Gaussian quaternion)."""
    q = rng.normal(size=4)
    w, x, y, z = q / np.linalg.norm(q)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
    ])


def make_model(o3d, make_mesh, rng: np.random.Generator, n_views: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """(complete [COMPLETE_POINTS, 3], n_views partial clouds [n_i, 3]) of one model."""
    mesh = make_mesh()
    vertices = np.asarray(mesh.vertices) @ _random_rotation(rng).T * rng.uniform(0.5, 1.5, size=3)
    vertices -= (vertices.min(0) + vertices.max(0)) / 2
    vertices *= RADIUS / np.linalg.norm(vertices, axis=1).max()
    mesh.vertices = o3d.utility.Vector3dVector(vertices)
    # open3d's uniform sampling draws from its own generator, seeded here from ours.
    o3d.utility.random.seed(int(rng.integers(2**31)))
    complete = np.asarray(mesh.sample_points_uniformly(COMPLETE_POINTS).points)
    views = []
    for _ in range(n_views):
        source = mesh.sample_points_uniformly(VIEW_SOURCE_POINTS)
        direction = rng.normal(size=3)
        camera = direction / np.linalg.norm(direction) * VIEW_DISTANCE
        _, visible = source.hidden_point_removal(camera, VIEW_DISTANCE * 100)
        views.append(np.asarray(source.points)[np.asarray(visible)])
    return complete, views


def write_default_dataset(root: Path) -> None:
    """Build the dataset into `root` (which must not exist; lavo_tasks.default_data builds
    it in a temporary folder and renames it when whole)."""
    o3d = load_open3d()
    rng = np.random.default_rng(DATA_SEED)
    primitives = _primitives(o3d, rng)
    taxonomy = []
    total = len(primitives) * sum(MODELS.values())
    with tqdm(total=total, desc="building the default shapes", unit="model") as bar:
        for k, (name, make_mesh) in enumerate(primitives.items()):
            synset = f"9{k + 1:07d}"
            entry = {"taxonomy_id": synset, "taxonomy_name": name}
            for split, count in MODELS.items():
                entry[split] = [f"{name}{split[:2]}{i:03d}" for i in range(count)]
                for model in entry[split]:
                    complete, views = make_model(o3d, make_mesh, rng, VIEWS[split])
                    write_pcd(root / split / "complete" / synset / f"{model}.pcd", complete)
                    for v, view in enumerate(views):
                        write_pcd(root / split / "partial" / synset / model / f"{v:02d}.pcd", view)
                    bar.update()
            taxonomy.append(entry)
    (root / TAXONOMY_FILE).write_text(json.dumps(taxonomy, indent=1) + "\n", encoding="utf-8")
