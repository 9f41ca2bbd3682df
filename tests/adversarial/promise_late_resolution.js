// A promise settled by a tool call's continuation, not by the tool call itself.
let resolveLater;
const p = new Promise((r) => { resolveLater = r; });
tools.echo({n: 1}).then(() => resolveLater("late"));
return await p;
