"""The policy side: the inference server, the evaluator, the actors' inline policy and
`load_policy`: everything that acts with trained parameters."""
