// After main has settled, a floating call's continuation loops forever: the run is still running.
tools.echo({}).then(() => { while (true) {} });
return "returned";
