"""Packaging driven by settings.ini (nbdev 2 convention), so `pip install -e ".[dev]"` installs everything."""
from configparser import ConfigParser
from pathlib import Path

import setuptools

cfg = ConfigParser(delimiters=["="])
cfg.read(Path(__file__).parent / "settings.ini", encoding="utf-8")
cfg = cfg["DEFAULT"]


def _reqs(key):
    return cfg.get(key, "").split()


setuptools.setup(
    name=cfg["lib_name"],
    version=cfg["version"],
    description=cfg["description"],
    long_description=Path("README.md").read_text(encoding="utf-8") if Path("README.md").exists() else "",
    long_description_content_type="text/markdown",
    author=cfg["author"],
    author_email=cfg["author_email"],
    license="Apache-2.0",
    python_requires=">=" + cfg["min_python"],
    packages=setuptools.find_packages(include=["uaqmem", "uaqmem.*"]),
    include_package_data=True,
    install_requires=_reqs("requirements"),
    extras_require={
        "dev": _reqs("dev_requirements"),
        "local": _reqs("local_model_requirements"),
        "local-large": _reqs("local_model_large_requirements"),
    },
    entry_points={"console_scripts": cfg["console_scripts"].split(), "nbdev": [f"{cfg['lib_name']}={cfg['lib_name']}._modidx:d"]},
    zip_safe=False,
)
