return new Proxy({}, { ownKeys() { throw new Error("ownKeys trap"); } });
