"""A native sampler after a restore, with the real llama.cpp server on real dockerd + CRIU: every copy of
one snapshot continues llama-cpp-python's seed chain where the checkpoint left it, so without a re-seed two copies
give the same "random" completions. The server run through docs/engines.md's llama_serve.py -- the very block a
reader copies -- restarts the chain from each restore's nonce in a RESTORE_POST hook: two copies of one snapshot
sample differently from each other and from what the checkpointed process answered next (which a copy without
the hook answers: test_llama_engine.py's test_restored_engine_is_the_checkpointed_process), and both still give
the snapshot's greedy answers."""

import pytest

import doc_blocks
from _llama_helpers import (LlamaEngine, llama_image, llama_model, llama_node, restore_env, snapshot_dir,
                            take_snapshot, unique_name)

FIXTURES = (llama_image, llama_model, llama_node)  # pytest finds the imported fixtures here
PROMPTS = ["what is an NPU?", "the quick brown fox"]
SERVE = "/opt/llama-serve"  # where the script is mounted, read-only
pytestmark = pytest.mark.timeout(900)


class Served(LlamaEngine):
    """The engine image with llama_serve.py in front of the server: python3 -m inferops_agent -- llama_serve.py."""

    def __init__(self, *args, **kwargs):
        serve_dir = kwargs.pop("serve_dir")
        kwargs["mounts"] = list(kwargs.get("mounts") or []) + ["%s:%s:ro" % (serve_dir, SERVE)]
        kwargs["docker_args"] = ["--entrypoint", "python3"]
        super(Served, self).__init__(*args, **kwargs)

    def server_args(self):
        return ["-m", "inferops_agent", "--", SERVE + "/llama_serve.py"] + super(Served, self).server_args()


def test_two_copies_of_one_llama_snapshot_sample_from_seeds_of_their_own(llama_node, llama_image, llama_model,
                                                                         tmp_path):
    serve = tmp_path / "serve"
    serve.mkdir()
    (serve / "llama_serve.py").write_text(doc_blocks.block("docs/engines.md", "llama-reseed-serve"))
    pod = unique_name("p")
    made = []
    try:
        original = Served(llama_image, llama_model, name=pod, serve_dir=serve)
        made.append(original.run())
        original.wait_ready()
        expected = original.completions(PROMPTS)
        snap = snapshot_dir(llama_node.roots, pod)
        take_snapshot(original, snap, pod)
        after = original.probes(2)  # what the checkpointed process samples next: a copy that is not re-seeded too
        original.remove()
        sampled = []
        for _copy in range(2):
            copy = Served(llama_image, llama_model, port=original.port, serve_dir=serve, runtime=llama_node.name,
                          env=restore_env(snap))
            made.append(copy.run())
            copy.wait_ready()
            record = llama_node.log_records(copy.id)[-1]
            assert record["outcome"] == "restored", record["reason"]
            assert record["reseed"]["told"] is True and record["reseed"]["hooks"] == 1, record["reseed"]
            sampled.append(copy.probes(2))
            assert copy.completions(PROMPTS) == expected, "the restored engine is the snapshot's"
            copy.remove()
        assert sampled[0] != after and sampled[1] != after, "a copy continued the checkpointed seed chain"
        assert sampled[0] != sampled[1], "two copies of one snapshot sampled the same"
    finally:
        for engine in made:
            engine.remove()
