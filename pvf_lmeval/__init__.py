"""pvf-lmeval: Plan-Verify-Fill and baseline decoders for diffusion LMs, as an lm-eval plugin."""

__version__ = "0.1.0"
