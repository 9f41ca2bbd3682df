// A floating continuation exhausts memory after main settled: nothing observes it, the result stands.
tools.echo({}).then(() => { const a = []; while (true) a.push([1]); });
return "returned";
