"""The two dockerd drivers' shared part: a container that does not exist is created to start cold only from a record
the verification vouches for (intact, and merely stale), never from one that may be forged."""

import types

import pytest

from ansible_collections.inferops.snapshot.plugins.module_utils.core.base import layout
from ansible_collections.inferops.snapshot.plugins.module_utils.core.base.errors import ParameterError
from ansible_collections.inferops.snapshot.plugins.module_utils.core.restore.docker_container import DockerContainer


class Docker:
    """dockerd as far as creating a container goes: what was created, and its id once it was."""

    def __init__(self, exists=False):
        self.created = []
        self.id = "c" * 64 if exists else None

    def container_id(self, name):
        return self.id

    def create(self, args, env=None):
        self.created.append(args)
        self.id = "d" * 64


def attempt(reasons, documents=(layout.MANIFEST, layout.CONTAINER_RECORD)):
    record = b'{"schema_version": 1}'
    return types.SimpleNamespace(verdict={"valid": not reasons, "reasons": reasons}, reason="; ".join(reasons) or None,
                                 documents=dict((rel, record) for rel in documents))


class Recording(DockerContainer):
    def create(self, attempt, env, runtime=None):
        self.docker.create(["--name", self.container], env=env)
        self.container_id, self.created = self.docker.container_id(self.container), True


@pytest.mark.parametrize("reasons", [[], ["image_mismatch: the image is another one now"]], ids=["valid", "stale"])
def test_a_missing_container_is_created_from_a_vouched_record_to_start_cold(reasons):
    driver = Recording(Docker(), "qwen-0")
    assert driver.create_to_start_cold(attempt(reasons)) is True and driver.created and driver.docker.created


@pytest.mark.parametrize("reasons, documents", [
    (["checksum_mismatch: host/container.json"], (layout.MANIFEST,)),
    (["signature_untrusted: signed by key 99db..., which this host does not trust"],
     (layout.MANIFEST, layout.CONTAINER_RECORD)),
], ids=["record not verified", "forged"])
def test_a_record_nothing_vouches_for_creates_nothing_and_says_so(reasons, documents):
    driver = Recording(Docker(), "qwen-0")
    with pytest.raises(ParameterError, match="^container: 'qwen-0' does not exist and there is no valid snapshot"):
        driver.create_to_start_cold(attempt(reasons, documents))
    assert driver.docker.created == [] and not driver.created


def test_a_container_that_exists_is_started_as_it_is():
    driver = Recording(Docker(exists=True), "qwen-0")
    assert driver.create_to_start_cold(attempt(["checksum_mismatch: host/criu/pages-1.img"])) is False
    assert driver.docker.created == []
