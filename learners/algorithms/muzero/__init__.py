"""MuZero's math (Schrittwieser et al. 2020), with Gumbel MuZero's search (Danihelka et
al. 2022) from mctx: the learned model, the scalar supports its reward and value heads
predict, the batched search that acts and reanalyses, and the K-step unrolled loss. Pure
functions and flax modules, no sockets."""
