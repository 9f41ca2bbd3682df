// Arguments nested past the depth limit: 201 and 1500 levels each fail their own call, the run goes on.
function deep(n) { let o = 1; for (let i = 0; i < n; i++) o = {a: o}; return o; }
const r = [];
for (const n of [200, 201, 1500]) {
  try { await tools.echo({o: deep(n - 1)}); r.push(n); } catch (e) { r.push(e.message.slice(0, 60)); }
}
return r;
