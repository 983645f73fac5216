"""The math of DLRM-DCNv2: dense arch, sharded embeddings, sharding plans.

Nothing here times, reads flags or environment variables: everything comes in as
constructor arguments (see docs/design.md, "Layers").
"""
