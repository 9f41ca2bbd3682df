// Date serialises to its ISO string; Map, Set, RegExp to {}; functions, symbols, undefined
// and symbol keys are dropped.
return {d: new Date(0), m: new Map([[1, 2]]), s: new Set([1]), r: /x/g, u: undefined,
        f() {}, sym: Symbol("q"), [Symbol("k")]: 1};
