// One real tool call, then a runaway loop.
const r = await tools.echo({step: 1});
console.log("got " + JSON.stringify(r));
while (true) {}
