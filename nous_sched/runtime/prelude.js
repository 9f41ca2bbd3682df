// The in-sandbox half of the bridge. Evaluated once per run, before the
// program, as one expression whose value (the `bridge` function) goes only to
// the host: no global names it, so a program cannot call it to settle its own
// calls, drain the outbox or fake its result.
//
// It takes nothing from the run, so a worker process can evaluate it in a fresh
// context before the run exists: the run's tool names and limits come once,
// through the bridge's "configure", before the program is compiled.
//
// Everything here uses intrinsics captured before the program runs, and
// null-prototype records, so a program that pollutes Object.prototype,
// Array.prototype, JSON or Promise changes only what it sees itself, never
// what crosses to the host.
//
// Five globals face the program: `tools` (a proxy: a declared name gives its
// tool, any other string a function whose call rejects with a ToolError naming
// the closest declared names, answered by the host; reading it, with
// Object.keys, `in` or JSON.stringify, shows only the declared tools),
// `sdk` (questions about the tools, answered by the host: describe, search),
// `state` (the run's state across runs: get, set, delete, keys, answered by
// the host the same way), `blobs` (slices of a result kept on the host:
// read) and `console`.
//
// Stack traces are formatted here, by a hook the program cannot replace, so
// that every line and column is the program's own (the host's wrapper puts
// its header on a line of its own before the program) and no frame of this
// file shows.
(function () {
  "use strict";
  const JSONstringify = JSON.stringify;
  const JSONparse = JSON.parse;
  const create = Object.create;
  const freeze = Object.freeze;
  const defineProperty = Object.defineProperty;
  const apply = Reflect.apply;
  const PromiseCtor = Promise;
  const promiseThen = Promise.prototype.then;
  const promiseReject = Promise.reject;
  const strSlice = String.prototype.slice;
  const StringCtor = String;
  const ErrorCtor = Error;
  const getPrototypeOf = Object.getPrototypeOf;
  const AsyncFunctionPrototype = getPrototypeOf(async function () {});
  const strSplit = String.prototype.split;
  const strIndexOf = String.prototype.indexOf;
  // indexOf called on a text by a plain call (bound once): on every call's
  // path, where Reflect.apply would first copy an argument list.
  const indexIn = apply(Function.prototype.bind, Function.prototype.call, [strIndexOf]);
  // Argument lists each call's path hands to `apply`, made once (frozen: only read).
  const FROM_START = freeze([0]);
  const captureStackTrace = ErrorCtor.captureStackTrace;
  const InternalErrorPrototype = typeof InternalError === "function" ? InternalError.prototype : null;
  const hasOwn = Object.prototype.hasOwnProperty;
  const ProxyCtor = Proxy;
  const preludeFunctions = new WeakSet();
  const weakAdd = WeakSet.prototype.add;
  const weakHas = WeakSet.prototype.has;

  // The lines of the wrapper's header before the program's first line (set by
  // configure()). The header has a line of its own because QuickJS counts the
  // columns of some expressions on a source's first line from 0, and from 1
  // on every other line.
  let LINE_OFFSET = 0;

  // A frame of this file's functions (the bridge, call, the tools) is noise
  // to the program's author and would show this file's line numbers.
  function own(f) {
    apply(weakAdd, preludeFunctions, [f]);
    return f;
  }

  function isOwn(site) {
    const f = site.getFunction();
    if (typeof f === "function" && apply(weakHas, preludeFunctions, [f])) return true;
    const name = site.getFunctionName();
    return typeof name === "string" && apply(strIndexOf, name, ["__nous_"]) === 0;
  }

  // `caller` is the frame below: a builtin this file called (JSON.stringify
  // on the program's value) is this file's frame too.
  function frameText(site, caller) {
    if (isOwn(site)) return "";
    const f = site.getFunction();
    const name = site.getFunctionName();
    if (site.isNative()) return caller !== undefined && isOwn(caller) ? "" : "    at " + name + " (native)\n";
    const file = site.getFileName();
    let line = site.getLineNumber();
    if (line > LINE_OFFSET) line -= LINE_OFFSET;
    const where = file + ":" + line + ":" + site.getColumnNumber();
    if (typeof f !== "function") return "    at " + where + "\n"; // no function: a syntax error
    return "    at " + (name ? name : "<anonymous>") + " (" + where + ")\n";
  }

  function formatSites(sites) {
    let text = "";
    for (let i = 0; i < sites.length; i++) text += frameText(sites[i], sites[i + 1]);
    return text;
  }

  // The call site of a tool call, captured cheaply: the hook hands back the
  // CallSites themselves for this one private object (they never leave this
  // file), and they are formatted only if the call fails.
  let siteHolder = null;
  function __nous_stack_hook(error, sites) {
    if (error === siteHolder && siteHolder !== null) return sites;
    // An InternalError comes only from the engine when it stops the program
    // (out of memory, interrupted at the deadline): running JavaScript then
    // would fail (no allocation can succeed) or be interrupted again, and
    // lose the error. It gets no stack.
    try {
      if (getPrototypeOf(error) === InternalErrorPrototype) return undefined;
      if (error.message === "out of memory") return undefined;
    } catch (_) {
      return undefined;
    }
    return formatSites(sites);
  }
  // (One holder for every capture: it never leaves this file, and each capture replaces its `stack`.)
  const SITES = create(null);
  // The engine's own Error.stackTraceLimit getter, kept before the program
  // can replace it: it reads the limit the engine captures with.
  const limitDescriptor = Object.getOwnPropertyDescriptor(ErrorCtor, "stackTraceLimit");
  const limitGet = limitDescriptor !== undefined && typeof limitDescriptor.get === "function" ? limitDescriptor.get : null;
  // (Bound to Error once: each capture reads it by a plain call, not Reflect.apply.)
  const readLimit = limitGet === null ? null : apply(Function.prototype.bind, limitGet, [ErrorCtor]);
  const mathFloor = Math.floor;
  // The call's sites, from the frame below `skip` (the `skipped` frames of
  // this file above it are not made: each costs the engine a CallSite). The
  // limit counts only the frames kept, so they are cut to what a capture of
  // every frame would have kept: the same sites, the same stack.
  function callSites(skip, skipped) {
    const holder = SITES;
    siteHolder = holder;
    try {
      const limit = readLimit === null ? undefined : readLimit();
      if (typeof limit !== "number") {
        // (A limit that is not a number: the engine's conversion of it is its own.)
        captureStackTrace(holder);
        return holder.stack;
      }
      captureStackTrace(holder, skip);
      const sites = holder.stack;
      const keep = limit > skipped ? mathFloor(limit) - skipped : 0;
      if (typeof sites === "object" && sites !== null && sites.length > keep) sites.length = keep;
      return sites;
    } finally {
      siteHolder = null;
    }
  }

  // quickjs-ng implements V8's Error.prepareStackTrace: an accessor that stores
  // one hook per context, set through *any* error constructor, whose CallSites
  // hand out every frame's function, the bridge's included. Set this file's
  // hook, then replace the accessor with a locked undefined before the program
  // exists, so no other hook can ever be set (the engine keeps the one set).
  ErrorCtor.prepareStackTrace = __nous_stack_hook;
  defineProperty(ErrorCtor, "prepareStackTrace", { value: undefined, writable: false, configurable: false });

  // Set once by configure(); until then every call and log line is refused.
  let configured = false;
  let MAX_LOG_UNITS = 0;
  let MAX_OUTPUT_UNITS = 0;
  let MAX_ARGS_UNITS = 0;
  let MAX_LOG_LINES = 0;
  let MAX_CALLS = 0;
  let MAX_TOTAL_ARGS_UNITS = 0;
  // What the calls sent so far carry: no more crosses than the run's limits
  // let through, so the host bounds every envelope by them (see call()).
  let callsSent = 0;
  let argsUnitsSent = 0;
  // A message longer than this is cut here, before it crosses; the host clips it further.
  const MAX_MESSAGE_UNITS = 8000;
  const MAX_NAME_UNITS = 1024;

  let nextId = 0;
  // The calls this step started, as the envelope's text for them (each call
  // writes its own entry when it is made: no record kept for the drain to
  // read back), how many, and the long texts that cross after the envelope.
  let outCalls = "";
  let outCount = 0;
  let outTail = "";
  let outPieces = 0;
  const waiting = create(null);
  let logs = create(null);
  let logCount = 0;
  let logUnits = 0;
  let logDropped = 0;
  let logKept = 0;
  let mainJson = "null";
  // The program's result, as JSON text, until a drain sends it (then null).
  let mainText = null;
  // The notes on the result (afterwords()), sent with it.
  let mainExtra = "";
  // A JSON text at least this long (a call's arguments, the result) crosses
  // after the envelope, as it is, instead of as a JSON string inside it: no
  // escaping here, no unescaping on the host. Each is preceded by SEP, which
  // no JSON.stringify output holds (it escapes every code unit below 0x20),
  // and stands in the envelope as its index among them.
  const OUT_OF_LINE = 512;
  const SEP = "\x01";
  // A tool's usual empty arguments, as the JSON string they cross as, made once.
  const EMPTY_ARGS = '"{}"';

  class ToolError extends ErrorCtor {
    constructor(tool, message) {
      super(message);
      defineProperty(this, "tool", { value: tool, enumerable: true });
    }
  }
  defineProperty(ToolError.prototype, "name", { value: "ToolError" });

  // A failed call's error: its stack is where the program made the call.
  function failedCall(tool, message, sites) {
    const error = new ToolError(tool, message);
    if (typeof sites === "object" && sites !== null) {
      defineProperty(error, "stack", { value: formatSites(sites), writable: true, configurable: true });
    }
    return error;
  }

  function describe(e) {
    try {
      if (e !== null && (typeof e === "object" || typeof e === "function")) {
        const message = e.message;
        if (typeof message === "string") {
          const name = e.name;
          let text = (typeof name === "string" && name ? name : "Error") + ": " + message;
          if (e instanceof ToolError) {
            const tool = e.tool;
            if (typeof tool === "string") text += " (tool " + JSONstringify(tool) + ")";
          }
          const stack = e.stack;
          if (typeof stack === "string" && stack) {
            const frames = programFrames(stack);
            if (frames) text += "\n" + frames;
          }
          return text;
        }
        const json = JSONstringify(e);
        return "Uncaught " + (json === undefined ? "object" : json);
      }
      if (typeof e === "string") return "Uncaught " + JSONstringify(e);
      return "Uncaught " + StringCtor(e) + (typeof e === "bigint" ? "n" : "");
    } catch (_) {
      return "Uncaught exception (its value could not be described)";
    }
  }

  // The bridge's own frames (named __nous_*) are noise to the program's author.
  function programFrames(stack) {
    const lines = apply(strSplit, stack, ["\n"]);
    let out = "";
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      if (line === "" || apply(strIndexOf, line, ["__nous_"]) !== -1) continue;
      out += (out ? "\n" : "") + line;
    }
    return out;
  }

  function cut(text) {
    return text.length > MAX_MESSAGE_UNITS ? apply(strSlice, text, [0, MAX_MESSAGE_UNITS]) : text;
  }

  function brief(e) {
    try {
      return cut(StringCtor(e.name) + ": " + StringCtor(e.message));
    } catch (_) {
      return "(an exception that could not be described)";
    }
  }

  // `name` is a tool's name, or null for a question to the host about the
  // tools (`sdk`), which `label` names in errors.
  // The call whose promise is being made: `file`, its executor (one for
  // every call, not a closure each), files it in `waiting`. The engine runs
  // an executor at once, inside `new`, and this one calls nothing else.
  let filing = null;
  const file = own(function (res, rej) {
    const w = filing;
    filing = null;
    w.res = res;
    w.rej = rej;
    waiting[w.id] = w;
  });

  // `quoted`: `name` as JSON text, when the caller has it (undefined: made here).
  // `tool`: the tool's function that called this one, when it was (its frame is this file's too).
  function call(name, args, label, quoted, tool) {
    const sites = tool === undefined ? callSites(call, 2) : callSites(tool, 3);
    let json;
    try {
      json = JSONstringify(args === undefined ? null : args);
    } catch (e) {
      return apply(promiseReject, PromiseCtor, [failedCall(label, "arguments are not JSON: " + brief(e), sites)]);
    }
    if (json !== undefined && json.length > MAX_ARGS_UNITS) {
      // Refused here, before anything crosses: the host never parses it.
      const message = "arguments are " + json.length + " characters of JSON, over the run's limit of " + MAX_ARGS_UNITS;
      return apply(promiseReject, PromiseCtor, [failedCall(label, message, sites)]);
    }
    // (`{}` alone, a tool's empty arguments, needs no search for it.)
    if (json !== undefined && (json === "{}" || indexIn(json, "{}") !== -1)) {
      // A Promise crosses as {}: a call whose result the program forgot to await.
      // The converter's promiseAt(args, "$", 0), its first level here: the
      // usual `{}` (a tool's empty arguments) then calls nothing of the
      // converter. The same steps in the same order (its prototype, whether
      // it is an array, its keys), so a Proxy's traps run as they would there.
      let at = null;
      if (typeof args === "object" && args !== null) {
        const proto = getPrototypeOf(args);
        if (proto === PromiseProto) at = "$";
        else if (isArray(args)) at = loadConverter().promiseInItems(args, "$", 0);
        else if (proto === ObjectProto || proto === null) {
          const keys = objectKeys(args);
          if (keys.length !== 0) at = loadConverter().promiseInKeys(args, keys, "$", 0);
        }
      }
      if (at !== null) {
        const message = "argument " + at + " is a Promise, not a value: a call whose result was not awaited; write `await` before that call";
        return apply(promiseReject, PromiseCtor, [failedCall(label, message, sites)]);
      }
    }
    // Past the call budget the host refuses every call (the first past it
    // with an audit event): the calls after that one are refused here, with
    // the host's words, and never cross.
    if (callsSent > MAX_CALLS) {
      const message = "the run has made its " + MAX_CALLS + " tool calls, the most one run may make (Limits.max_calls)";
      return apply(promiseReject, PromiseCtor, [failedCall(name === null ? "sdk" : label, message, sites)]);
    }
    const units = json === undefined ? 4 : json.length;
    if (argsUnitsSent + units > MAX_TOTAL_ARGS_UNITS) {
      // Every call sent counts here, refused ones too (the host counts the
      // UTF-8 bytes of those it admits, never fewer than these characters).
      const message =
        "the run's tool calls have sent " + argsUnitsSent + " characters of arguments in all, the most one run may send (Limits.max_total_args_bytes)";
      return apply(promiseReject, PromiseCtor, [failedCall(name === null ? "sdk" : label, message, sites)]);
    }
    callsSent++;
    argsUnitsSent += units;
    const id = ++nextId;
    // A name longer than any the host accepts (gate.MAX_NAME_CHARS) crosses
    // cut, still too long: the host refuses it without the whole of it.
    if (name !== null && name.length > MAX_NAME_UNITS) {
      name = apply(strSlice, name, [0, MAX_NAME_UNITS]);
      quoted = undefined;
    }
    // The arguments cross as their own text (a JSON string, or after the
    // envelope when long): the host parses each call's text on its own,
    // under its own rules, so one bad call fails alone.
    const text = json === undefined ? "null" : json;
    let arg;
    let tail = outTail;
    let pieces = outPieces;
    if (text.length >= OUT_OF_LINE) {
      arg = "" + pieces++;
      tail += SEP + text;
    } else if (text === "{}") {
      arg = EMPTY_ARGS;
    } else if (indexIn(text, '"') === -1) {
      // No string in the text, so nothing to escape (a backslash is only
      // ever inside one): the JSON string JSON.stringify would write.
      arg = '"' + text + '"';
    } else {
      arg = JSONstringify(text);
    }
    const entry = (outCount === 0 ? "[" : ",[") + id + "," + (quoted !== undefined ? quoted : JSONstringify(name)) + "," + arg + "]";
    // (Every text is made before any is kept: a failure part way leaves the step's calls as they were.)
    outCalls += entry;
    outCount++;
    outTail = tail;
    outPieces = pieces;
    if (clockOn) siteNew[siteNew.length] = siteOf(sites);
    filing = { res: null, rej: null, sites: sites, name: label, id: id };
    const promise = new PromiseCtor(file);
    // Iterating the call instead of its result: `for await` gets the result's
    // items, a plain `for ... of` (or a spread) an error that names the fix.
    defineProperty(promise, SymbolIterator, NOT_ITERABLE);
    defineProperty(promise, SymbolAsyncIterator, ITEMS_OF);
    return promise;
  }
  own(call);

  const SymbolIterator = Symbol.iterator;
  const SymbolAsyncIterator = Symbol.asyncIterator;
  const notIterable = own(function () {
    throw new TypeError("a tool call returns a Promise, not its result: await it first, e.g. `for (const item of await tools.name(args))`");
  });
  // (An iterator object, not an async generator: the prelude is evaluated for
  // every run, and a generator function costs it a third of a millisecond.)
  const itemsOf = own(function () {
    const promise = this;
    let items = null;
    const step = own(function (value) {
      if (items === null) {
        if (value === null || typeof value !== "object" || typeof value[SymbolIterator] !== "function") {
          throw new TypeError("`for await` over a tool call: its result is not a list; iterate a list inside it (e.g. `(await tools.name(args)).items`) or Object.entries(await tools.name(args))");
        }
        items = value[SymbolIterator]();
      }
      return items.next();
    });
    return {
      next: own(function () {
        return apply(promiseThen, promise, [step]);
      }),
    };
  });

  // Every call's promise gets these two descriptors, made once and with no
  // prototype: nothing the program puts on Object.prototype (a `get`, a
  // `writable`) can change what they say, or make the call throw.
  const NOT_ITERABLE = create(null);
  NOT_ITERABLE.value = notIterable;
  freeze(NOT_ITERABLE);
  const ITEMS_OF = create(null);
  ITEMS_OF.value = itemsOf;
  freeze(ITEMS_OF);

  function __nous_settle(id, ok, payload) {
    const w = waiting[id];
    if (w === undefined) return;
    delete waiting[id];
    // ("null", the most common answer, is not parsed: JSON.parse gives the same null.)
    const value = payload === "null" ? null : JSONparse(payload);
    if (ok) w.res(value);
    else w.rej(failedCall(value.tool, value.message, w.sites));
  }

  function format(args) {
    let line = "";
    for (let i = 0; i < args.length; i++) {
      const v = args[i];
      let text;
      if (typeof v === "string") text = v;
      else if (v instanceof ErrorCtor) text = describe(v);
      else if (typeof v === "object" && v !== null) {
        // An object logs by the result's rule, its conversions said after it.
        const notes = { count: 0, list: [] };
        try {
          text = toJSONText(v, notes);
          if (text !== undefined && notes.count) text += " [" + apply(arrayJoin, notes.list, ["; "]) + "]";
        } catch (_) {
          text = undefined;
        }
        if (text === undefined) text = "[unprintable]";
      } else {
        try {
          text = JSONstringify(v);
        } catch (_) {
          text = undefined;
        }
        if (text === undefined) {
          try {
            text = StringCtor(v);
          } catch (_) {
            text = "[unprintable]";
          }
        }
      }
      line += (i ? " " : "") + text;
    }
    return line;
  }

  // Every line costs its length plus one, so empty lines spend the budget
  // too, and at most MAX_LOG_LINES lines are kept: the host counts the same.
  function emit(prefix, args) {
    if (logUnits >= MAX_LOG_UNITS || logKept >= MAX_LOG_LINES) {
      logDropped++;
      return;
    }
    let line = prefix + format(args);
    const room = MAX_LOG_UNITS - logUnits - 1;
    if (line.length > room) {
      logDropped++; // a cut line counts as lost, so the host adds the marker
      if (room <= 0) {
        logUnits = MAX_LOG_UNITS;
        return;
      }
      line = apply(strSlice, line, [0, room]);
    }
    logUnits += line.length + 1;
    logKept++;
    logs[logCount++] = line;
  }


  // Durable runs (nous_sched/durable/_replay.py) only: Date.now(), new Date(),
  // Math.random() and performance.now() are read through here, so a replay
  // gets the values the first run read, in the same order, and a live run
  // hands each new value to the host in the envelope ("clock").
  let clockOn = false;
  let clockReplay = [];
  let clockAt = 0;
  let clockNew = [];
  const DateCtor = Date;
  const construct = Reflect.construct;
  const dateNow = Date.now;
  const mathRandom = Math.random;
  // Read when the clock is switched on, before the program runs: by then the
  // engine has given the run its own performance (counting from the run's start).
  let perf = null;
  let perfNow = null;
  function clockValue(read) {
    if (clockAt < clockReplay.length) return clockReplay[clockAt++];
    const value = read();
    clockNew[clockNew.length] = value;
    return value;
  }
  function readNow() {
    return apply(dateNow, DateCtor, []);
  }
  function readRandom() {
    return apply(mathRandom, Math, []);
  }
  function readPerf() {
    return apply(perfNow, perf, []);
  }
  function clock(replayJson) {
    if (clockOn) return;
    clockOn = true;
    clockReplay = JSONparse(replayJson);
    perf = typeof globalThis.performance === "object" && globalThis.performance !== null ? globalThis.performance : null;
    perfNow = perf !== null ? perf.now : null;
    const DurableDate = function Date(...args) {
      if (new.target === undefined) return StringCtor(new DateCtor(clockValue(readNow)));
      if (args.length === 0) return apply(construct, null, [DateCtor, [clockValue(readNow)], new.target]);
      return apply(construct, null, [DateCtor, args, new.target]);
    };
    const open = { writable: true, configurable: true };
    defineProperty(DurableDate, "prototype", { value: DateCtor.prototype });
    defineProperty(DurableDate, "now", { ...open, value: function now() { return clockValue(readNow); } });
    defineProperty(DurableDate, "parse", { ...open, value: DateCtor.parse });
    defineProperty(DurableDate, "UTC", { ...open, value: DateCtor.UTC });
    defineProperty(DateCtor.prototype, "constructor", { ...open, value: DurableDate });
    defineProperty(globalThis, "Date", { ...open, value: DurableDate });
    defineProperty(Math, "random", { ...open, value: function random() { return clockValue(readRandom); } });
    if (perf !== null && typeof perfNow === "function") {
      // The engine's performance.now is locked: the program gets a performance of its own.
      const durablePerf = create(getPrototypeOf(perf));
      defineProperty(durablePerf, "timeOrigin", { value: perf.timeOrigin, enumerable: true });
      defineProperty(durablePerf, "now", { value: function now() { return clockValue(readPerf); }, enumerable: true });
      defineProperty(globalThis, "performance", { ...open, value: durablePerf });
    }
  }
  // A durable run's call sites ("line:col" of the program, one per call in
  // the envelope's order), for its approval requests.
  let siteNew = [];
  function siteOf(sites) {
    if (typeof sites !== "object" || sites === null) return "";
    for (let i = 0; i < sites.length; i++) {
      const site = sites[i];
      if (isOwn(site) || site.isNative()) continue;
      let line = site.getLineNumber();
      if (line > LINE_OFFSET) line -= LINE_OFFSET;
      return line + ":" + site.getColumnNumber();
    }
    return "";
  }
  function clockDrained() {
    if (!clockOn) return "";
    let out = "";
    if (clockNew.length !== 0) out += ',"clock":' + JSONstringify(clockNew);
    if (siteNew.length !== 0) out += ',"sites":' + JSONstringify(siteNew);
    clockNew = [];
    siteNew = [];
    return out;
  }

  // What a step that started no call, logged nothing and did not end the
  // program drains (most of a Promise.all's settles): the same text, made once.
  const NOTHING_NEW = '{"calls":[],"logs":[],"dropped":0,"main":null}';
  const CALLS_ONLY_END = '],"logs":[],"dropped":0,"main":null}';

  function drain() {
    if (outCount === 0 && logCount === 0 && logDropped === 0 && mainText === null && mainJson === "null" && !clockOn) {
      return NOTHING_NEW;
    }
    let out = '{"calls":[' + outCalls;
    let tail = outTail;
    let pieces = outPieces;
    if (outCount !== 0) {
      outCalls = outTail = "";
      outCount = outPieces = 0;
    }
    if (pieces === 0 && logCount === 0 && logDropped === 0 && mainText === null && mainJson === "null" && !clockOn) {
      // The usual step (calls only): the rest of the envelope is the same text every time.
      return apply(strSlice, out + CALLS_ONLY_END, FROM_START);
    }
    out += '],"logs":[';
    if (logCount !== 0) {
      for (let i = 0; i < logCount; i++) out += (i ? "," : "") + JSONstringify(logs[i]);
      logs = create(null);
      logCount = 0;
    }
    // The program's result crosses once: the host keeps it from the first
    // envelope that carries it, however many calls are still outstanding.
    if (mainText !== null) {
      if (mainText.length >= OUT_OF_LINE) {
        mainJson = '{"state":"fulfilled","json":' + pieces++ + mainExtra + "}";
        tail += SEP + mainText;
      } else {
        mainJson = '{"state":"fulfilled","json":' + JSONstringify(mainText) + mainExtra + "}";
      }
      mainText = null;
    }
    out += '],"dropped":' + logDropped + ',"main":' + mainJson + clockDrained() + "}" + tail;
    mainJson = "null";
    // Concatenation builds a rope string, which the binding cannot convert: flatten it.
    return apply(strSlice, out, FROM_START);
  }

  // The one rule for values with no faithful JSON form (documented in
  // nous_sched/result/_hints.py, which turns the notes into the answer's hint):
  // Map -> object (string keys) or [key, value] pairs, Set -> array,
  // Date -> ISO string, typed array / ArrayBuffer -> array of numbers,
  // BigInt -> decimal string, NaN/Infinity -> null, undefined -> null in an
  // array and dropped from an object, function/symbol/Promise -> null in an
  // array and dropped from an object, a reference back to an enclosing value
  // (a cycle) -> null, any other class instance -> its own fields. Each
  // conversion is noted with its path ($ is the value itself).
  const MapProto = Map.prototype;
  const SetProto = Set.prototype;
  const DateProto = Date.prototype;
  const ObjectProto = Object.prototype;
  const ArrayProto = Array.prototype;
  const PromiseProto = Promise.prototype;
  const isArray = Array.isArray;
  const objectKeys = Object.keys;
  const mapEntries = Map.prototype.entries;
  const setValues = Set.prototype.values;
  const dateISO = Date.prototype.toISOString;
  const dateTime = Date.prototype.getTime;
  const isView = ArrayBuffer.isView;
  const U8 = Uint8Array;
  const ABProto = ArrayBuffer.prototype;
  const numberIsFinite = Number.isFinite;
  const isRawJSON = typeof JSON.isRawJSON === "function" ? JSON.isRawJSON : undefined;
  const mapIterNext = getPrototypeOf(new Map().entries()).next;
  const setIterNext = getPrototypeOf(new Set().values()).next;
  const arrayJoin = Array.prototype.join;
  const charCodeAt = String.prototype.charCodeAt;
  const MAX_NOTES = 8;
  const NOTE_UNITS = 200;
  // The converter (convert.js) is compiled the first time a value needs it:
  // most results are plain data, and compiling it with the prelude would cost
  // every run about 0.4 ms. Its source arrives once, before any program
  // (the bridge's "converter"); it uses only what it is handed here.
  let converterSource = null;
  let converter = null;
  const indirectEval = eval;
  function loadConverter() {
    if (converter === null) {
      const make = indirectEval(converterSource);
      converter = make(freeze({
        getPrototypeOf, isArray, objectKeys, defineProperty, create, apply, strSlice, StringCtor, ErrorCtor,
        JSONstringify, mapEntries, setValues, mapIterNext, setIterNext, dateISO, dateTime, isView, U8,
        ABProto, MapProto, SetProto, DateProto, ObjectProto, PromiseProto, numberIsFinite, isRawJSON,
        charCodeAt, own, MAX_NOTES, NOTE_UNITS,
      }));
    }
    return converter;
  }
  own(loadConverter);
  function toJSONText(v, notes) {
    // A value of up to COPY_VALUES values is read once (a getter runs once,
    // as JSON.stringify runs it) into a plain copy; only what the copy cannot
    // hold goes to the converter. A bigger one is written by JSON.stringify
    // (a walk in JavaScript would double what crossing it costs), and goes to
    // the converter only when its text shows what JSON.stringify did to a
    // value the rule converts otherwise: `{}` (a Map, Set, Promise), `null`
    // (NaN, undefined in an array), `{"0":` (a typed array), or when it
    // throws (a BigInt, a cycle). Its Dates, dropped undefined fields and
    // class instances come out as the rule has them, unnoted.
    copyBudget = COPY_VALUES;
    const copy = plainCopy(v, 0);
    if (copy === TOO_BIG) {
      let json;
      try {
        json = JSONstringify(v);
      } catch (_) {
        json = undefined;
      }
      if (typeof json === "string" && apply(strIndexOf, json, ["{}"]) === -1 && apply(strIndexOf, json, ["null"]) === -1 &&
          apply(strIndexOf, json, ['{"0":']) === -1) return json;
    } else if (copy !== NOT_PLAIN) return JSONstringify(copy);
    return loadConverter().toJSONText(v, notes);
  }
  // `v` as JSON.stringify would write it, copied: finite numbers, strings,
  // booleans, null, arrays and plain objects of them. NOT_PLAIN for anything
  // else, or deeper than 64 (a cycle): then the converter reads it (again).
  const NOT_PLAIN = create(null);
  const TOO_BIG = create(null);
  const COPY_VALUES = 2048;
  let copyBudget = 0;
  // A null-prototype descriptor: a program that sets Object.prototype.get
  // cannot make it an accessor's.
  const DATA = create(null);
  DATA.value = undefined;
  DATA.enumerable = true;
  DATA.writable = true;
  DATA.configurable = true;
  function plainCopy(v, depth) {
    if (--copyBudget < 0) return TOO_BIG;
    const kind = typeof v;
    if (kind === "string" || kind === "boolean" || v === null) return v;
    if (kind === "number") return numberIsFinite(v) ? v : NOT_PLAIN;
    if (kind !== "object" || depth > 64) return NOT_PLAIN;
    if (isArray(v)) {
      const out = [];
      const n = v.length;
      for (let i = 0; i < n; i++) {
        const item = plainCopy(v[i], depth + 1);
        if (item === NOT_PLAIN || item === TOO_BIG) return item;
        DATA.value = item;
        defineProperty(out, i, DATA);
      }
      return out;
    }
    if (isRawJSON !== undefined && isRawJSON(v)) return v;
    const proto = getPrototypeOf(v);
    if (proto !== ObjectProto && proto !== null) return NOT_PLAIN;
    if (typeof v.toJSON === "function") return NOT_PLAIN;
    const keys = objectKeys(v);
    const out = {};
    for (let i = 0; i < keys.length; i++) {
      const item = plainCopy(v[keys[i]], depth + 1);
      if (item === NOT_PLAIN || item === TOO_BIG) return item;
      DATA.value = item;
      defineProperty(out, keys[i], DATA);
    }
    DATA.value = undefined;
    return out;
  }
  own(toJSONText);
  own(plainCopy);

  function onFulfilled(v) {
    const kind = typeof v;
    if (kind === "function" || kind === "symbol") {
      mainJson = '{"state":"invalid","error":' + JSONstringify("the program returned a " + kind + ", which has no JSON form") + "}";
      return;
    }
    const notes = { count: 0, list: [] };
    let json;
    try {
      json = v === undefined ? "null" : toJSONText(v, notes);
    } catch (e) {
      mainJson = '{"state":"invalid","error":' + JSONstringify("the program's result has no JSON form: " + brief(e)) + "}";
      return;
    }
    if (json === undefined) json = "null";
    if (json.length > MAX_OUTPUT_UNITS) {
      mainJson = '{"state":"output_limit","size":' + json.length + "}";
      return;
    }
    mainText = json;
    mainExtra = afterwords(v === undefined, notes);
  }

  // What the host turns into hints (nous_sched/result/_hints.py): the program
  // returned nothing, what its result's conversion noted, which calls it
  // left pending when it ended.
  function afterwords(none, notes) {
    let out = "";
    if (none) out += ',"none":true';
    if (notes.count) out += ',"notes":' + JSONstringify(notes.list) + ',"noted":' + notes.count;
    let pending = "";
    let count = 0;
    for (const id in waiting) {
      if (count++ >= MAX_NOTES) break;
      pending += (count > 1 ? "," : "") + JSONstringify(waiting[id].name);
    }
    if (count) out += ',"pending":[' + pending + "]";
    return out;
  }
  own(afterwords);

  function onRejected(e) {
    mainJson = '{"state":"rejected","error":' + JSONstringify(cut(describe(e))) + "}";
  }

  // Whether `main` is the program's function: the host wraps the program as
  // `(async function program() {<code>\n})`; anything else means the code
  // closed that function early. (The engine calls `main`, bound by the
  // bridge: no frame of this file is under the program's first step.)
  function __nous_start(main) {
    if (typeof main !== "function" || getPrototypeOf(main) !== AsyncFunctionPrototype) {
      onRejected(new SyntaxError("unbalanced braces: the program closes the function it runs in"));
      return false;
    }
    return true;
  }

  function makeTool(name) {
    let quoted; // the name as JSON text, for the envelope: made at its first call, once per run
    // (Assigned from own(...): the function keeps the empty name a program sees.)
    let tool = null;
    tool = own(function (args) {
      // (A name past MAX_NAME_UNITS crosses cut: quoting the whole of it could exhaust the heap.)
      if (quoted === undefined && name.length <= MAX_NAME_UNITS) quoted = JSONstringify(name);
      return call(name, args, name, quoted, tool);
    });
    return freeze(tool);
  }

  // Names the engine and the language look up on any object (awaiting it,
  // JSON.stringify, string conversion): an undeclared one must read as
  // absent, or `return tools` would call a tool named "then".
  const PROTOCOL = create(null);
  PROTOCOL.then = true;
  PROTOCOL.toJSON = true;
  PROTOCOL.toString = true;
  PROTOCOL.valueOf = true;
  PROTOCOL.toLocaleString = true;
  PROTOCOL.constructor = true;
  PROTOCOL.__proto__ = true;

  const declared = create(null);
  // The declared names arrive as one JSON array text (configure) and are not
  // parsed for a program that only calls tools: a name it reads is looked up
  // in that text (isDeclared), and the tools' functions are made one by one
  // as they are read (made). Anything that asks for the whole shape (keys,
  // `in`, descriptors, extensibility, a write) first makes every tool and
  // freezes `declared` (materialize): from then on it is the frozen object of
  // the declared tools it always was, in the same order. A run's start costs
  // the same whatever the tool count.
  let namesJson = "[]";
  let made = create(null);
  let lookup = null;
  let scans = 0;
  let materialized = false;
  // Whether `key` is in namesJson: its JSON text after a newline. The host
  // writes a newline before each element, written as JSON.stringify would
  // write the name (nous_sched.runtime.engine.names_json). A newline is never
  // raw inside a JSON string, so a match starts at an element's opening quote,
  // and its closing quote can only be that element's: a whole element. (A
  // match between [ or , and , or ] is not: `","` is inside `["[","]"]`.)
  function isDeclared(key) {
    if (key.length >= namesJson.length) return false; // (no name is longer than all of them: nothing copied)
    if (lookup !== null) return lookup[key] === true;
    if (++scans > MAX_SCANS) {
      // A program reading many names: one lookup table instead of a scan per name.
      const names = JSONparse(namesJson);
      lookup = create(null);
      for (let i = 0; i < names.length; i++) lookup[names[i]] = true;
      return lookup[key] === true;
    }
    return apply(strIndexOf, namesJson, ["\n" + JSONstringify(key)]) !== -1;
  }
  const MAX_SCANS = 32;
  function materialize() {
    if (materialized) return;
    materialized = true;
    const names = JSONparse(namesJson);
    for (let i = 0; i < names.length; i++) {
      const name = names[i];
      const f = made[name];
      defineProperty(declared, name, { value: f !== undefined ? f : makeTool(name), enumerable: true });
    }
    freeze(declared);
    namesJson = null;
    made = null;
    lookup = null;
  }
  own(isDeclared);
  own(materialize);
  // Every trap but `get` makes the whole shape first, then answers as the
  // frozen object would. `get` never calls the program's code.
  const whole = function (operation) {
    return own(function (target, a, b, c) {
      materialize();
      return apply(operation, undefined, [target, a, b, c]);
    });
  };
  const tools = new ProxyCtor(declared, {
    get: own(function (target, key) {
      if (typeof key !== "string") return undefined;
      if (materialized) {
        if (apply(hasOwn, target, [key])) return target[key];
      } else {
        const f = made[key];
        if (f !== undefined) return f;
        if (isDeclared(key)) return (made[key] = makeTool(key));
      }
      if (PROTOCOL[key] === true) return undefined;
      return makeTool(key);
    }),
    has: whole(Reflect.has),
    ownKeys: whole(Reflect.ownKeys),
    getOwnPropertyDescriptor: whole(Reflect.getOwnPropertyDescriptor),
    defineProperty: whole(Reflect.defineProperty),
    deleteProperty: whole(Reflect.deleteProperty),
    isExtensible: whole(Reflect.isExtensible),
    preventExtensions: whole(Reflect.preventExtensions),
    set: whole(Reflect.set),
    setPrototypeOf: whole(Reflect.setPrototypeOf),
    getPrototypeOf: whole(Reflect.getPrototypeOf),
  });

  function ask(question, label, args) {
    return call(null, [question, args], label);
  }
  own(ask);
  const sdkObject = create(null);
  defineProperty(sdkObject, "describe", {
    value: freeze(
      own(function describe(name) {
        return ask("describe", "sdk.describe", [name]);
      }),
    ),
    enumerable: true,
  });
  defineProperty(sdkObject, "search", {
    value: freeze(
      own(function search(words, limit) {
        return ask("search", "sdk.search", limit === undefined ? [words] : [words, limit]);
      }),
    ),
    enumerable: true,
  });
  freeze(sdkObject);
  // `blobs`: a tool result too big to cross stays on the host; the program
  // holds a handle ({$blob, kind, size, length, preview}) and reads it in
  // slices, each a question the host answers (nous_sched/blobs.py).
  const blobsObject = create(null);
  defineProperty(blobsObject, "read", {
    value: freeze(
      own(function read(handle, start, length) {
        const args = [handle === undefined ? null : handle];
        if (start !== undefined || length !== undefined) args[1] = start === undefined ? 0 : start;
        if (length !== undefined) args[2] = length;
        return ask("read_blob", "blobs.read", args);
      }),
    ),
    enumerable: true,
  });
  freeze(blobsObject);

  // `state`: the run's state across runs (run_code(state=...)), answered by
  // the host in order with the calls, like `sdk`: never a tool, so no tool
  // name reaches it. A write of a key this run read fails with a ToolError
  // whose message starts "conflict:" when another run wrote it since.
  const stateObject = create(null);
  function stateOp(op, args) {
    return ask("state." + op, "state." + op, args);
  }
  own(stateOp);
  defineProperty(stateObject, "get", {
    value: freeze(own(function get(key) { return stateOp("get", [key]); })),
    enumerable: true,
  });
  defineProperty(stateObject, "set", {
    value: freeze(
      own(function set(key, value) {
        return stateOp("set", value === undefined ? [key] : [key, value]);
      }),
    ),
    enumerable: true,
  });
  defineProperty(stateObject, "delete", {
    value: freeze(own(function (key) { return stateOp("delete", [key]); })),
    enumerable: true,
  });
  defineProperty(stateObject, "keys", {
    value: freeze(own(function keys() { return stateOp("keys", []); })),
    enumerable: true,
  });
  freeze(stateObject);

  // The run's own `performance` (configure gives it, at the run's start):
  // now() counts from then and timeOrigin is the wall clock then, so neither
  // tells when the context was made or what ran before (the engine's own
  // counts from the context's creation). Configurable, as the engine's own
  // was: a durable run's clock replaces it before the program runs. (Here,
  // not compiled afresh per run: a fork server's children inherit it made.)
  const enginePerformance = globalThis.performance;
  const enginePerfNow = enginePerformance.now;
  const functionBind = Function.prototype.bind;
  const START_ARGS = freeze([undefined]);
  function runClock() {
    const now_ = apply(functionBind, enginePerfNow, [enginePerformance]);
    const t0 = now_();
    const origin = apply(dateNow, DateCtor, []);
    // (Bound: a program sees a native function, as before, with no source to read.)
    const now = own(function now() {
      return now_() - t0;
    });
    const p = freeze({ now: apply(functionBind, now, [null]), timeOrigin: origin });
    defineProperty(globalThis, "performance", { value: p, writable: false, configurable: true, enumerable: false });
  }
  own(runClock);

  // names: a JSON array of tool names; limitsJson: [log, output, args] units, then log lines,
  // calls and the run's total argument units, then 1 when `names` is written as JSON.stringify would;
  // offset: the lines of the wrapper's header before the program's first line.
  function configure(names, limitsJson, offset) {
    if (configured) return;
    configured = true;
    runClock();
    const limits = JSONparse(limitsJson);
    MAX_LOG_UNITS = limits[0];
    MAX_OUTPUT_UNITS = limits[1];
    MAX_ARGS_UNITS = limits[2];
    MAX_LOG_LINES = limits[3];
    MAX_CALLS = limits[4];
    MAX_TOTAL_ARGS_UNITS = limits[5];
    if (typeof offset === "number") LINE_OFFSET = offset;
    if (typeof names === "string") namesJson = names;
    // (0: the host could not write the names as JSON.stringify would: every tool made now.)
    if (limits[6] !== 1) materialize();
  }
  const logger = function (prefix) {
    return freeze(
      own(function () {
        emit(prefix, arguments);
      }),
    );
  };
  own(describe);
  own(brief);
  own(cut);
  own(format);
  own(emit);
  own(drain);
  own(onFulfilled);
  own(onRejected);
  own(__nous_start);
  own(__nous_settle);
  own(failedCall);
  own(callSites);
  own(ToolError);
  own(logger);
  own(configure);
  own(clock);
  own(clockValue);
  own(clockDrained);
  own(siteOf);
  const consoleObject = freeze({
    log: logger(""),
    info: logger(""),
    debug: logger(""),
    warn: logger("[warn] "),
    error: logger("[error] "),
  });
  freeze(ToolError.prototype);
  freeze(ToolError);
  defineProperty(globalThis, "tools", { value: tools });
  defineProperty(globalThis, "sdk", { value: sdkObject });
  defineProperty(globalThis, "state", { value: stateObject });
  defineProperty(globalThis, "blobs", { value: blobsObject });
  defineProperty(globalThis, "console", { value: consoleObject });
  defineProperty(globalThis, "ToolError", { value: ToolError });

  return function __nous_bridge(op, a, b, c) {
    if (op === "drain") return drain();
    if (op === "settle") return __nous_settle(a, b, c);
    // The engine calls the program itself, `main` bound to no `this` as a
    // call from here had it: no frame of this file is below the program's
    // first step, so no call it makes captures one (see callSites).
    if (op === "start") return __nous_start(a) ? apply(functionBind, a, START_ARGS) : null;
    if (op === "started") {
      apply(promiseThen, a, [onFulfilled, onRejected]);
      return undefined;
    }
    if (op === "configure") return configure(a, b, c);
    if (op === "clock") return clock(a);
    if (op === "converter") {
      if (converterSource === null) converterSource = a;
      return undefined;
    }
    // Compiled now by a fork server, before any program exists, so each of its
    // children inherits it (engine.prepare's `shared`).
    if (op === "load converter") {
      if (converterSource !== null) loadConverter();
      return undefined;
    }
    return undefined;
  };
})()
