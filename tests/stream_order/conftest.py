"""The pool on asynchronous devices, without TensorFlow: recorded traces
replayed on queued streams (tf_plugin._pool_replay, trace_replay.h), and the
CUDA backend's build. Nothing here loads TensorFlow or the plugin library."""
