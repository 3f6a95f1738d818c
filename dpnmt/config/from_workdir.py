"""`--config=<this file>:<workdir>`: a training run's own config.json as its config.

`python -m dpnmt.train --workdir=W` without `--config` resumes W with this
(`dpnmt.train` adds the flag); `--config.x=` overrides apply on top and the
workdir's binding rules check them as for any config.
"""

from dpnmt import config_lib


def get_config(arg=None):
    """The config.json of the workdir `arg`, as a ConfigDict."""
    return config_lib.workdir_config(arg or ".")
