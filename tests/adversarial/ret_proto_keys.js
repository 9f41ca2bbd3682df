// __proto__ in a literal sets the prototype; "constructor"/"prototype" keys are plain data.
return {"__proto__": {inherited: true}, "constructor": {"prototype": {"polluted": true}}, own: 1};
