"""Which flag sets each library parameter: the table through which the command line's errors name flags.

The library names parameters (``gamma=0``, :func:`foal_pipe.errors.param`); a command's option named after a
parameter sets it (:func:`foal_pipe.cli.options.settings`), so the flag of ``name`` is ``--name`` with dashes,
except where :data:`FLAGS` says otherwise.
"""

from __future__ import annotations

from typing import Any

from foal_pipe.errors import NO_VALUE

#: ``--no-X`` options: each sets the parameter ``X`` to the opposite of the flag.
NEGATED = {"no_mask_unseen": "mask_unseen", "no_fusion_norm": "fusion_norm", "no_loo": "loo"}
#: Parameters whose flag is not ``--name``: the negated ones, the projection's (``SmoothProjection``) and the
#: class orders of ``run_learn_orders``/``run_sweep_orders``.
FLAGS: dict[str, str] = {
    **{name: "--" + option.replace("_", "-") for option, name in NEGATED.items()},
    "n_components": "--projection-dim",
    "init": "--projection-init",
    "random_state": "--seed",
    "seeds": "--order-seeds",
    "run_dir": "--run",
    "head_options": "--head-option",
}


#: The heads' options with a flag of their own (``--shrinkage``); any other is set with ``--head-option NAME=VALUE``.
HEAD_OPTION_FLAGS = ("shrinkage", "shrinkage_offdiag", "compensation", "gamma_comp")


def _head_option(name: str) -> bool:
    """Whether ``name`` is a head option without a flag of its own (the registry read now: any head's)."""
    from foal_pipe.protocol.config import head_option_names

    return name not in FLAGS and name not in HEAD_OPTION_FLAGS and name in head_option_names()


def cli_form(name: str, value: Any = NO_VALUE) -> str:
    """How the command line sets ``name`` (to ``value``): ``--gamma``, ``--gamma 1``; a switch is its flag alone
    (``--drop-last`` for ``drop_last=True``, ``--no-loo`` for ``loo=False``); a head option without a flag of its own
    ``--head-option NAME=VALUE``."""
    if _head_option(name):
        return f"--head-option {name}" if value is NO_VALUE else f"--head-option {name}={value}"
    flag = FLAGS.get(name, "--" + name.replace("_", "-"))
    return flag if value is NO_VALUE or isinstance(value, bool) else f"{flag} {value}"
