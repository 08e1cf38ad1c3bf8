"""How late a loaded machine may be: the one bound of the tests that a deadline, a
timeout or a cancellation is honoured at once."""

LATE = 3.0
"""How long after its time a run may notice a deadline, a timeout or a cancellation, or
end what must end at once, on a loaded machine (event loops stalled 0.5-1 s with four
test processes on two cores in CI). A test bounded by it makes what it guards against
take far longer: a hang, or a wait of 10 s or more. How fast is a benchmark's figure."""
