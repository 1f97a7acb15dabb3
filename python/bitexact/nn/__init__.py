"""The framework-neutral plumbing of bitexact's training layers (no public
API: bitexact.torch and bitexact.paddle are the public faces). Each
module here allocates, checks and keeps autograd state for both
frameworks; every value is computed by the model module's nodes
(src/glm, through bitexact._core.glm_*), never here:

- _gradred: the GradReduction's bookkeeping (the one-pass step on a grid
  stated from the history and its fallback, run_step; the two-pass protocol,
  run_two_pass; micro-batches, the states' agree / all-reduce / finish) and
  a node's ``grads`` argument;
- _layers: the dense layers' autograd bodies (linear, q/k/v, RMSNorm, the
  SwiGLU MLP, embedding, cross-entropy, RoPE, attention) and the module
  bodies;
- _moe: the MoE block and moe_experts;
- _ep: expert parallelism's communicator (the all-to-alls the MoE node
  calls back).
"""
