// A floating call whose continuation makes another call and logs: both calls run and are audited.
tools.echo({}).then(() => tools.add({x: 1, y: 1})).then((v) => console.log("late", v));
return "returned";
