// The loop hides in a getter that only the host-side serialisation of the result invokes.
return { ok: true, get trap() { while (true) {} } };
