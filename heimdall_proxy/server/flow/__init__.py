"""Admission and flow control: objectives, the gateway's queues, and their dispatcher."""
