// A failing tool call nobody catches.
await tools.fail({message: "nope"});
