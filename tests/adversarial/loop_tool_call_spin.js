// A loop that makes tool calls forever (each one is fast).
let n = 0;
async function spin() { while (true) { n++; await tools.echo({n}); } }
return await spin();
