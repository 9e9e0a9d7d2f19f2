"""Hatchling build hook: ship the lm-eval registration hook in editable installs too.

For normal wheels, ``[tool.hatch.build.targets.wheel.force-include]`` in pyproject.toml
puts ``pvf_lmeval_hook.pth`` / ``pvf_lmeval_hook.py`` at the top of site-packages and
copies ``tasks/`` and ``vocab_artifacts/`` into the package. Hatchling applies that same
table to editable wheels, which would leave stale copies of tasks/ in site-packages; this
hook narrows the editable wheel's forced files to the two hook files (the editable
install reads tasks/ and vocab_artifacts/ from the checkout, see pvf_lmeval/files/paths.py).
"""

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

_HOOK_FILES = {
    "pvf_lmeval/_site_hook/pvf_lmeval_hook.pth": "pvf_lmeval_hook.pth",
    "pvf_lmeval/_site_hook/pvf_lmeval_hook.py": "pvf_lmeval_hook.py",
}


class PVFBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version, build_data):
        if self.target_name == "wheel" and version == "editable":
            build_data["force_include_editable"] = dict(_HOOK_FILES)
