// A loop that swallows every failure still ends: the call budget refuses calls past it.
let ok = 0, refused = 0;
for (let i = 0; i < 5000; i++) {
  try { await tools.echo({i}); ok++; } catch (e) { refused++; }
}
return [ok, refused];
