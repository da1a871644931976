# -*- coding: utf-8 -*-
# Copyright: inferops.snapshot contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fresh randomness for a process restored from a snapshot. PRIVATE to the inferops.snapshot collection.

Every process restored from one snapshot -- each restore, each clone -- starts with the same memory, so with the
same state of every pseudo-random generator in it: Python's ``random``, NumPy's and PyTorch's global generators,
OpenSSL's DRBG (it reseeds itself when the pid changes, and CRIU restores the pid), and any sampler the engine
keeps. Without a re-seed every copy repeats the same "random" request ids, TLS secrets and sampling seeds.

``reseed_interpreter`` re-seeds what the agent can reach in this interpreter, only where it is already loaded (it
never imports NumPy or PyTorch; a generator loaded later seeds itself from the OS then). What it cannot reach --
generator objects the engine made itself (``random.Random()``, ``numpy.random.default_rng()``, a native
sampler) -- the engine re-seeds in its RESTORE_POST hook, from the nonce it is given (docs/engines.md).
``os.urandom``, ``secrets`` and ``uuid.uuid4`` read the kernel's generator and need nothing.

Pure standard library: this file is copied into engine images with the rest of the agent folder.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import binascii
import os
import sys

RESTORE_POST = "RESTORE_POST"  # the stage of Controller.register_hook: after this process was restored
STAGES = (RESTORE_POST,)
SEED_BYTES = 32


def new_nonce():
    """16 fresh random bytes in hex, the form of the metadata file's restore_nonce."""
    return binascii.hexlify(os.urandom(16)).decode("ascii")


def _seed_random(module, fresh):
    module.seed(fresh)


def _seed_numpy(module, fresh):
    module.seed([int.from_bytes(fresh[i:i + 4], "little") for i in range(0, len(fresh), 4)])


def _seed_torch(module, fresh):
    # CPU, and every CUDA (or other accelerator) device's default generator, lazily where not yet initialised
    module.manual_seed(int.from_bytes(fresh[:8], "little") >> 1)


def _seed_ssl(module, fresh):
    module.RAND_add(fresh, float(len(fresh)))


# name in results -> (the modules that hold it, in sys.modules, first found wins; how to re-seed it)
GENERATORS = (
    ("random", ("random",), _seed_random),              # the module's global Random instance
    ("numpy", ("numpy.random",), _seed_numpy),          # the legacy global RandomState (np.random.rand, ...)
    ("torch", ("torch",), _seed_torch),                 # torch.manual_seed: CPU and device default generators
    ("ssl", ("ssl", "_ssl"), _seed_ssl),                # OpenSSL's DRBG, mixed with fresh bytes
)


def reseed_interpreter(modules=None):
    """Re-seed the loaded generators of this interpreter from the kernel's generator, each with bytes of its own.

    Returns (names re-seeded, {name: error}) -- one generator that fails does not keep the others from it.
    ``modules``: sys.modules (a test's stand-in)."""
    modules = sys.modules if modules is None else modules
    done, errors = [], {}
    for name, holders, seed in GENERATORS:
        module = next((modules[m] for m in holders if modules.get(m) is not None), None)
        if module is None:
            continue
        try:
            seed(module, os.urandom(SEED_BYTES))
        except Exception as exc:  # pylint: disable=broad-except  # a half-imported library: say so, go on
            errors[name] = "%s: %s" % (type(exc).__name__, exc)
        else:
            done.append(name)
    return done, errors
