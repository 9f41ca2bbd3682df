// A real call first, then a promise nothing will ever settle.
await tools.echo({a: 1});
return await new Promise(() => {});
