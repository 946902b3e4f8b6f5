"""The OmegaConf YAML files, shipped inside the package (read with importlib.resources)."""
