"""How the backend's pieces go into a model: each is a subclass of a transformers module, switched in place."""

from __future__ import annotations

from torch import nn


def use_subclasses(model: nn.Module, subclasses: dict[type, type]) -> nn.Module:
    """Switch every module of ``model`` whose exact class is a key of ``subclasses`` to its value, in place: the
    backend's pieces are subclasses of transformers' modules, so parameters, state-dict keys and configs stay."""
    for module in model.modules():
        subclass = subclasses.get(type(module))
        if subclass is not None:
            module.__class__ = subclass
    return model
