# lit configuration for epic's IR tests (test/Dialect, test/Conversion, ...).
# Runs from the build tree through lit.site.cfg.py, which sets the paths below.
import os

import lit.formats
from lit.llvm import llvm_config

config.name = "epic"
# lit's internal shell: portable, and the only one lit >= 23 supports.
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.epic_obj_root, "test")
# Only IR tests live under lit; unit/ and python/ have their own runners.
config.excludes = ["unit", "python", "Inputs", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py"]

config.environment["FILECHECK_OPTS"] = "--enable-var-scope --dump-input=fail"
llvm_config.use_default_substitutions()
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
llvm_config.add_tool_substitutions(
    ["epic-opt", "epic-compile", "epic-run"], [config.epic_tools_dir])
llvm_config.add_tool_substitutions(
    ["FileCheck", "not", "count", "split-file"], [config.llvm_tools_dir])

# %nccl_version: the NCCL epic builds against. Each NCCL the build made an extra nccl shim for
# (EPIC_EXTRA_NCCL_ROOTS), e.g. 2.32.3: the feature nccl-2.32 and %nccl_2_32 (-> 2.32.3, for
# epic-compile --nccl-shim).
config.substitutions.append(("%nccl_version", config.nccl_version))
for version in filter(None, config.extra_nccl_versions.split(";")):
    major_minor = ".".join(version.split(".")[:2])
    config.available_features.add("nccl-" + major_minor)
    config.substitutions.append(("%nccl_" + major_minor.replace(".", "_"), version))

# The DSL's tests (test/DSL/*.py) run kernels through `python -m epic.dsl` with the source tree's
# package (epic._ir is built into python/epic).
config.substitutions.append(("%python", config.python_executable))
config.environment["PYTHONPATH"] = os.path.join(config.epic_src_root, "python")
