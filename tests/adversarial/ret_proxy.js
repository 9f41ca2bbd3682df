return new Proxy({a: 1, b: 2}, { get(t, k) { return k === "a" ? "proxied" : t[k]; } });
