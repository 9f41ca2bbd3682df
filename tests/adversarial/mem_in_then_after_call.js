// Exhaust memory inside a promise job, after a real tool call.
await tools.echo({});
await Promise.resolve().then(() => { const a = []; while (true) a.push({x: [1, 2, 3]}); });
