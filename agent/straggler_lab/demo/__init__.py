"""The demo's field case: a four-rank data-parallel training job (trainer), the checkpoint
writer that slows one node down (ckpt_writer), and the orchestration that runs the whole
story on the test bed (run). Nothing here is imported by the agent or the analysis."""
