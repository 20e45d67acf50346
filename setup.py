"""Ships the recipes (configs/) and the embedded data (data/) inside the package, as spanlm/share/.

Everything else about the build is in pyproject.toml. The two folders stay at the repository root, where
the README's commands, `make demo` and the tests use them; a wheel gets a copy under spanlm/share/ with
the same layout, so a path such as data/corpus/frankenstein.txt names the same file under either root
(spanlm.recipes.shipped_root finds it). MANIFEST.in puts the same files into the sdist.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

# Only these files, so that nothing else lying in a working copy's configs/ or data/ is shipped.
SHIPPED = {
    "configs": ["*/*.yaml"],
    "data": [
        "README.md",
        "corpus/*.txt",
        "ner/*/*.conll",
        "ner/*/*.txt.gz",
        "qa/*/*.json",
        "cls/*/*.tsv",
        "cls/*/*.json",
    ],
}


class BuildPyWithShippedFiles(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # an editable install reads them from the checkout itself
            return
        share = Path(self.build_lib) / "spanlm" / "share"
        shutil.rmtree(share, ignore_errors=True)  # no file of an earlier build (a recipe since removed) survives
        for folder, patterns in SHIPPED.items():
            for pattern in patterns:
                for source in sorted(Path(folder).glob(pattern)):
                    target = share / source
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, target)


setup(cmdclass={"build_py": BuildPyWithShippedFiles})
