// Arguments Python would read as inf, or as an integer JavaScript cannot hold: each call fails alone.
const r = [];
for (const raw of ["1e400", "-1e400", "9".repeat(4300), "9".repeat(5000), "9007199254740993"]) {
  try { await tools.echo({n: JSON.rawJSON(raw)}); r.push("crossed"); } catch (e) { r.push([e.tool, e.message.slice(0, 40)]); }
}
try { r.push(await tools.echo({n: 2 ** 53 - 1})); } catch (e) { r.push(e.message); }
return r;
