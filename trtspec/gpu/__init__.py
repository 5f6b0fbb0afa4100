"""The GPU machine trtspec's GPU check runs on: its package set, the wheels that travel there, and a
guard that makes a CPU interpreter import like it (`trtspec.gpu.image`)."""
