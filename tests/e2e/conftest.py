"""This tier needs the runtime: the pool is TensorFlow's allocator before any op."""
from tests.conftest import install_runtime

install_runtime()
