// The thrown value is a Proxy whose every property read loops: describing it must not hang the host.
throw new Proxy(new Error("inner"), { get(t, k) { while (true) {} } });
