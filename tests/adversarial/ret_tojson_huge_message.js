// A 20-million-character error message from toJSON: the run's message is clipped.
return {toJSON() { throw new Error("x".repeat(20e6)); }};
