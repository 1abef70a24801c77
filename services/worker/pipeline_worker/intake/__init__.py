"""The consumer thread: polling, assignment, commit marks, flow control, burst ends."""
