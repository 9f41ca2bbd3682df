// Floating calls whose failures nobody observes: the result stands.
tools.echo({}).then(() => { throw new Error("floating boom"); });
tools.fail({message: "unobserved"});
return "returned";
