"""The framework-neutral part of bitexact's layer bindings
(bitexact.torch and bitexact.paddle layers, docs/torch_layers.md,
docs/paddle_layers.md): the token-reduction protocol of a training step's
weight gradients (the one-pass step on a grid stated from the history,
with its deterministic fallback, and the two-pass step) and the
per-micro-batch bookkeeping the autograd functions of both frameworks
share.

:class:`GradReductionBase` owns one ``bitexact._core.GradRed``: the model
module's gradient reduction of a step (src/glm glm_gr: the states of the
gradients and of the loss, begin (two-pass, or on a stated grid), the
micro-batches that pass 1 must repeat, agree, all-reduce, the observed
exponents, finish), the object `bitexact train` runs; the nodes add their
partials to it. A framework subclass supplies the few
things that need the framework (argument checks, allocation, writing
``.grad``, its process groups as a communicator) through the ``_fw_*``
hooks. Nothing numeric is here, so a torch and a Paddle step over the
same data produce the same bits.

Threading: the active micro-batch is thread-local (one per thread, shared
by the frameworks: a module of one framework inside the other's
micro-batch finds weights that are not that reduction's and raises); a
reduction is used by one thread at a time.
"""
import contextlib as _contextlib
import itertools as _itertools
import operator as _operator
import re as _re
import sys as _sys
import threading as _threading
import weakref as _weakref

_PEER_RE = _re.compile(r"^(.*\.experts)\.[0-9]+\.(.*)$")

from .. import Error, InvalidArgumentError, _comm_args, _core
from .. import kernels as _k

_tls = _threading.local()  # the reduction whose micro_batch() this thread runs


def _active():
    return getattr(_tls, "red", None)


class forward_tokens:
    """``with forward_tokens(tok0):`` a forward outside any GradReduction
    micro-batch (evaluation) whose rows are global tokens tok0, tok0 + 1,
    ...: the ids the expert-parallel MoE exchange orders rows by (inside a
    micro-batch they come from it). Not reentrant; this thread only."""

    def __init__(self, tok0):
        self.tok0 = int(tok0)

    def __enter__(self):
        _tls.forward_tok0 = self.tok0
        return self

    def __exit__(self, *exc):
        _tls.forward_tok0 = None
        return False


def _forward_tok0():
    return getattr(_tls, "forward_tok0", None)


def _err(cls, fn, name, text):
    """cls("fn: argument 'name': text") with .argument = name."""
    e = cls(f"{fn}: argument '{name}': {text}")
    e.argument = name
    return e


def _renamed(e, names, fn=None):
    """A token reduction's error with 'tensor i' followed by the parameter's
    name (and, with fn, the GradRed method that raised it named fn)."""
    msg = _re.sub(r"tensor (\d+)", lambda m: f"tensor {m.group(1)} ({names[int(m.group(1))]})"
                  if int(m.group(1)) < len(names) else m.group(0), str(e))
    if fn is not None:
        msg = _re.sub(r"^GradRed\.\w+:", fn + ":", msg)
    n = type(e)(msg)
    n.__dict__.update(getattr(e, "__dict__", {}))
    return n


_OBJECTS = _weakref.WeakValueDictionary()  # key -> an object a compiled call names (register)
_KEYS = _itertools.count(1)


def register(obj):
    """obj._bx_key := a new key naming obj in a compiled graph (an integer
    argument of bitexact.torch's custom op; expert parallelism's object)."""
    obj._bx_key = next(_KEYS)
    _OBJECTS[obj._bx_key] = obj


def registered(key):
    """The object :func:`register` gave ``key`` (it must still be alive)."""
    obj = _OBJECTS.get(key)
    if obj is None:
        raise InvalidArgumentError(f"a compiled bitexact call names object {key}, which no "
                                   "longer exists (recompile after replacing it)")
    return obj


def bf16_active():
    """Whether the active micro-batch's reduction computes its GEMMs in bf16
    (``GradReduction(compute_dtype="bf16")``)."""
    red = _active()
    return bool(red is not None and red.compute_dtype == "bf16")


def _threads(mod_threads):
    """A module's num_threads, else the active reduction's, else 0 (the
    library default)."""
    if mod_threads is not None:
        return mod_threads
    red = _active()
    return red.num_threads if red is not None else 0


class GradReductionBase:
    """The protocol of :class:`bitexact.torch.GradReduction` and
    :class:`bitexact.paddle.GradReduction` (their docstrings; the
    framework's subclass is the public class). Hooks:

    - ``_fw_check_param(name, p)``: raise a named bitexact error for a
      parameter that cannot be trained here (dtype, device, contiguity,
      not requiring grad);
    - ``_fw_empty_f32(shape)``: a new fp32 CPU tensor of the framework;
    - ``_fw_set_grad(p, g)``: p's gradient := g (replaced);
    - ``_fw_comm(comm)``: (allreduce function or None, rank) for comm
      (None, a bitexact.Comm, or the framework's process group);
    - ``_fw_targets(fn, targets)``: targets checked, as a flat integer
      tensor; ``_fw_empty_i64(n)``, ``_fw_bytes(t)``: for count_targets.
    """

    def __init__(self, parameters, seq_len, total_tokens, *, num_threads=0, compute_dtype="fp32",
                 expert_parallel=None):
        names, params = [], []
        for i, it in enumerate(list(parameters)):
            name, p = it if isinstance(it, tuple) else (f"parameters[{i}]", it)
            self._fw_check_param(name, p)
            names.append(name)
            params.append(p)
        index = {}
        for i, p in enumerate(params):
            if id(p) in index:
                raise _err(InvalidArgumentError, "GradReduction", names[i],
                           f"is {names[index[id(p)]]} again")
            index[id(p)] = i
        if int(seq_len) < 1 or int(total_tokens) < 1 or int(num_threads) < 0:
            raise InvalidArgumentError(f"GradReduction: seq_len {seq_len} and total_tokens "
                                       f"{total_tokens} must be >= 1, num_threads {num_threads} >= 0")
        if compute_dtype not in ("fp32", "bf16"):
            raise InvalidArgumentError(f"GradReduction: compute_dtype {compute_dtype!r}: 'fp32' or "
                                       "'bf16' (bf16 GEMM operands, fp32 accumulation)")
        self.compute_dtype = compute_dtype
        self._param_keys = {(p.data_ptr(), tuple(p.shape)) for p in params}
        self._bf16_copies = {}  # bf16 compute: the parameters rounded this step
        self.names, self.params, self._index = names, params, index
        self._index_by_name = {n: i for i, n in enumerate(names)}
        self.seq_len, self.total_tokens, self.num_threads = int(seq_len), int(total_tokens), int(num_threads)
        # two-pass: idle -> bound -> add -> done; one pass: idle -> stated -> add -> reduced
        # (or overflowed: begin again) -> done; any -> failed on an error that voids the step
        self.phase = "idle"
        self.loss = None
        self.passes = None  # forward + backward passes of the last run_step / run_two_pass
        self.overflowed = None  # after allreduce: an add broke the stated grid (on any rank)
        self._observed = None  # after allreduce: the n + 1 observed exponents (a list)
        self._gr_bounds = None  # the stated bounds of the step (a list), None: two-pass
        self._history = None  # the last finished step's observed exponents (a list) or None
        self.n_targets = self.total_tokens
        self._gen = 0
        # the protocol (begin, micro-batches, agree, allreduce, finish) is the
        # model module's object, the one `bitexact train` runs (glm_gr)
        # expert parallelism: the held experts' weights (ExpertParallel.own) are reduced over
        # their replicas only, their grids agreed there (`bitexact train`'s rule)
        self._ep = expert_parallel
        where = [1 if expert_parallel is not None and expert_parallel.is_local(p) else 0
                 for p in params]
        self._wnames = [n for n, w in zip(names, where) if not w]
        self._xnames = [n for n, w in zip(names, where) if w]
        self._gr = _core.GradRed(params, self.seq_len, self.total_tokens,
                                 where if any(where) else None)
        self._mb = None
        # the bound groups of the one-pass step (glm_gr_peer_bounds): the routed experts'
        # tensors "PREFIX.experts.E.REST" of one PREFIX and REST, numbered in the sorted
        # order of (PREFIX, REST), so every rank numbers them alike under expert parallelism
        keys = {}
        for n in names:
            m = _PEER_RE.match(n)
            if m:
                keys.setdefault((m.group(1), m.group(2)), None)
        num = {k: i for i, k in enumerate(sorted(keys))}
        self._peers = []
        for n in names:
            m = _PEER_RE.match(n)
            self._peers.append(num[(m.group(1), m.group(2))] if m else -1)
        self._npeer = len(num)

    def _names_for(self, e):
        """The names a state error's 'tensor i' indexes (the state it names)."""
        msg = str(e)
        if "(loss)" in msg:
            return ["loss"]
        return self._xnames if "(local tensors)" in msg else self._wnames

    def _xcomm(self):
        return self._ep.replica_comm() if self._ep is not None else (None, 0)

    # -- the grid history (the one-pass step) --
    GRID_MARGIN = _core.GRID_MARGIN  # a stated bound = the history's exponent + this (<= 128)
    GRID_DECAY = _core.GRID_DECAY  # the history after a step: max(observed, history - this)

    def _exponents(self, fn, arg, value):
        """value (a dict {name: exponent, ..., "loss": exponent} with exactly
        this reduction's parameter names and "loss", or a sequence of
        len(names) + 1 ints in the parameters' order, then the loss) as a
        list; InvalidArgumentError naming the key otherwise."""
        n1 = len(self.names) + 1
        if isinstance(value, dict):
            if "loss" in self._index_by_name:
                raise _err(InvalidArgumentError, fn, arg, "a parameter is named 'loss': give "
                           f"a sequence of {n1} ints (the parameters' order, then the loss)")
            keys = self.names + ["loss"]
            missing = [k for k in keys if k not in value]
            extra = [k for k in value if k not in self._index_by_name and k != "loss"]
            if missing or extra:
                raise _err(InvalidArgumentError, fn, arg,
                           f"keys {'missing ' + repr(missing[:3]) if missing else ''}"
                           f"{', ' if missing and extra else ''}"
                           f"{'unexpected ' + repr(extra[:3]) if extra else ''}: exactly the "
                           "parameters' names and 'loss' expected")
            value = [value[k] for k in keys]
        elif isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
            raise _err(InvalidArgumentError, fn, arg, f"is a {type(value).__name__}: a dict "
                       f"name -> exponent or a sequence of {n1} ints expected")
        out = list(value)
        if len(out) != n1:
            raise _err(InvalidArgumentError, fn, arg, f"holds {len(out)} values, {n1} expected "
                       "(one per parameter, then the loss)")
        keys = self.names + ["loss"]
        for k, v in zip(keys, out):
            if isinstance(v, bool) or not hasattr(type(v), "__index__"):
                raise _err(InvalidArgumentError, fn, arg, f"{k}: {v!r} is not an int")
            if not -149 <= _operator.index(v) <= 128:
                raise _err(InvalidArgumentError, fn, arg, f"{k}: {_operator.index(v)} is outside "
                           "[-149, 128]")
        return [_operator.index(v) for v in out]

    def _as_dict(self, values):
        return None if values is None else dict(zip(self.names + ["loss"], values))

    @property
    def history(self):
        """The grid history: {parameter name: exponent, ..., "loss": exponent}
        (the parameters' order, then the loss); after each finished step
        max(observed, history - GRID_DECAY) (`bitexact train`'s
        glm_gr_next_history), observed being the largest frexp exponent of
        any finite chunk-partial element the step added to each gradient
        and to the loss, over every rank (-149: none or all 0; the first
        step: observed); None before any step. A function of the data only
        (every layout gives the same), so a checkpoint keeps it and
        :meth:`run_step` states the next step's grid from it. Settable (a
        dict as above or a sequence of ints in [-149, 128], checked; None
        forgets it). Under expert parallelism it covers the dense
        parameters, this rank's experts and the loss."""
        return self._as_dict(self._history)

    @history.setter
    def history(self, value):
        self._history = None if value is None else self._exponents("GradReduction.history",
                                                                   "history", value)

    @property
    def observed(self):
        """After :meth:`allreduce`: this step's observed exponents, as
        :attr:`history` (None otherwise)."""
        return self._as_dict(self._observed)

    def stated_bounds(self, history=None, top=None):
        """The bounds a one-pass step states from history (a dict or
        sequence as :attr:`history`; None: none, every bound -149, so the
        step only observes), as a dict like :attr:`history`
        (`bitexact train`'s glm_gr_stated_bounds): min(exponent +
        GRID_MARGIN, 128) each; a gradient that never saw an addend (-149)
        takes the largest gradient exponent of the history and of ``top``
        (an int: the largest of the model's tensors this reduction does not
        hold, i.e. the other ranks' experts under expert parallelism;
        :meth:`run_step` all-reduces it); then, with a history, the routed
        experts' tensors named ``PREFIX.experts.E.REST`` take the largest
        bound of their (PREFIX, REST) group (glm_gr_peer_bounds; under
        expert parallelism :meth:`run_step` adds the other ranks' experts)."""
        h = None if history is None else self._exponents("GradReduction.stated_bounds",
                                                         "history", history)
        try:
            b = self._gr.stated_bounds(h, top)
            if h is not None and self._npeer:
                b, _ = self._gr.peer_bounds(b, self._peers, [-149] * self._npeer)
            return self._as_dict(b)
        except Error as e:
            raise _renamed(e, self.names, "GradReduction.stated_bounds") from e

    def _peer_bounds(self, bounds, comm):
        """The routed experts' bound rule (glm_gr_peer_bounds): each
        group's tensors take the group's largest bound, under expert
        parallelism over every rank's experts (one small MAX all-reduce of
        the groups' largest over comm)."""
        b, gmax = self._gr.peer_bounds(bounds, self._peers, [-149] * self._npeer)
        fn, _ = self._fw_comm(comm) if self._ep is not None else (None, 0)
        if fn is None:
            return b
        buf = bytearray(b"".join(int(g).to_bytes(8, _sys.byteorder, signed=True) for g in gmax))
        r = fn(buf, "max")
        raw = bytes(buf if r is None else r)
        gmax = [int.from_bytes(raw[8 * i:8 * i + 8], _sys.byteorder, signed=True)
                for i in range(self._npeer)]
        return self._gr.peer_bounds(bounds, self._peers, gmax)[0]

    # -- the passes --
    def begin(self, n_targets=None, bounds=None, flag_overflow=True):
        """Start a step. ``n_targets``: the global count of targets that are
        not ``ignore_index`` (the loss divisor; default ``total_tokens``,
        every target valid; :meth:`count_targets`).

        ``bounds`` None: the two-pass step (pass 0 bounds the partials,
        :meth:`agree`, pass 1 adds the same micro-batches). ``bounds`` a dict
        or sequence as :attr:`history` (:meth:`stated_bounds` of a history,
        or an :attr:`observed` as it stands): the one-pass step on that
        stated grid: :meth:`agree` at once, every micro-batch once (adding),
        :meth:`allreduce`, which says whether an add broke the grid;
        ``flag_overflow`` True: such an add flags the step (then
        :meth:`begin` again, e.g. with ``bounds=self.observed``, which
        holds), False: it raises in the backward. :meth:`run_step` does all
        of it."""
        n = self.total_tokens if n_targets is None else int(n_targets)
        if n < 1:
            raise InvalidArgumentError(f"GradReduction.begin: n_targets {n} must be >= 1")
        b = None if bounds is None else self._exponents("GradReduction.begin", "bounds", bounds)
        self._bf16_copies = {}
        self.overflowed = self._observed = None
        self._gr_bounds = b
        if b is None:
            self._gr.begin()
        else:
            try:
                self._gr.begin(b, bool(flag_overflow))
            except Error as e:
                self.phase = "failed"
                raise _renamed(e, self._names_for(e), "GradReduction.begin") from e
        self.n_targets, self.loss = n, None
        self.phase = "bound" if b is None else "stated"
        self._gen += 1

    def agree(self, comm=None):
        """End pass 0 (two-pass) or follow begin at once (a stated grid):
        agree the grids (one small MAX all-reduce per state); the adding
        pass follows."""
        self._require(("bound", "stated"), "agree")
        fn, rank = self._fw_comm(comm)
        xfn, xrank = self._xcomm()
        try:
            self._gr.agree(fn, rank=rank, xcomm=xfn, xrank=xrank)
        except Error as e:
            self.phase = "failed"
            raise _renamed(e, self._names_for(e), "GradReduction.agree") from e
        self.phase = "add"
        self._gen += 1

    def allreduce(self, comm=None):
        """End the adding pass: SUM all-reduce of the int64 words (with an
        agreement step that also combines the observed exponents and the
        overflow flags); returns whether an add broke the stated grid on any
        rank (the same on every rank; always False for the two-pass step).
        :attr:`observed` is then this step's exponents. False: :meth:`finish`
        writes the gradients; True: the step is void, :meth:`begin` it
        again."""
        self._require("add", "allreduce")
        return self._allreduce(comm, "GradReduction.allreduce")

    def _allreduce(self, comm, what):
        fn, rank = self._fw_comm(comm)
        xfn, xrank = self._xcomm()
        try:
            self._gr.allreduce(fn, rank=rank, xcomm=xfn, xrank=xrank)
        except Error as e:
            if self._gr.pass_ != 1:  # pass 1 was complete (nothing happened: still 'add')
                self.phase = "failed"
            raise _renamed(e, self._names_for(e), what) from e
        try:
            obs, over = self._gr.history()
        except Error as e:
            self.phase = "failed"
            raise _renamed(e, self._names_for(e), what) from e
        self._observed, self.overflowed = obs, bool(over)
        self.phase = "overflowed" if over else "reduced"
        self._gen += 1
        return self.overflowed

    def _overflow_error(self, fn):
        bounds = self._gr_bounds
        broke = [k for k, o, b in zip(self.names + ["loss"], self._observed or [], bounds or [])
                 if o > b]
        return InvalidArgumentError(
            f"{fn}: an add broke the stated grid ({', '.join(broke[:3]) or 'a tensor'}"
            f"{'...' if len(broke) > 3 else ''}: observed exponent above the stated bound); the "
            "step is void: begin(bounds=self.observed) and run its micro-batches again "
            "(run_step does)")

    def finish(self, comm=None):
        """End the step: after the adding pass, :meth:`allreduce` first (here
        when not called yet), then every parameter's gradient = its gradient
        (replaced, not accumulated), ``self.loss`` and :attr:`history`
        (updated with this step's observed exponents). A step whose stated grid was broken
        (:meth:`allreduce` returned True) is refused. Nothing is written on
        error."""
        self._require(("add", "reduced"), "finish")  # overflowed: the overflow's error
        if self.phase == "add":
            self._allreduce(comm, "GradReduction.finish")
        if self.phase == "overflowed":
            raise self._overflow_error("GradReduction.finish")
        self.phase = "failed"  # until everything below succeeded
        try:
            outs = [self._fw_empty_f32(list(p.shape)) for p in self.params]
            loss = self._fw_empty_f32([])
            if not self._gr.finish(outs, loss, self.n_targets):
                loss = None  # no rank added a loss chunk
        except Error as e:
            raise _renamed(e, self._names_for(e), "GradReduction.finish") from e
        for p, g in zip(self.params, outs):
            self._fw_set_grad(p, g)
        self.loss, self.phase = loss, "done"
        self._history = self._gr.next_history(self._history, self._observed)
        self._gen += 1
        return loss

    def run_two_pass(self, closure, micro_batches, comm=None, n_targets=None):
        """One two-pass step: ``micro_batches`` a list of (first_token,
        num_tokens) (global token ids, whole sequences), ``closure(i)`` runs
        the forward and backward of micro-batch i; run for pass 0, agree,
        run again, finish. Returns the closure's pass-1 results."""
        self.begin(n_targets)
        self._run_all(closure, micro_batches)
        self.agree(comm)
        out = self._run_all(closure, micro_batches)
        self.finish(comm)
        self.passes = 2
        return out

    def run_step(self, closure, micro_batches, comm=None, n_targets=None, use_history=True,
                 failed=None):
        """One step as `bitexact train` runs it (docs/train_model.md, "The
        one-pass invariant step"): ``micro_batches`` and ``closure(i)`` as
        :meth:`run_two_pass`. Attempt 1 states the grid from
        :attr:`history` (:meth:`stated_bounds`; none, or ``use_history``
        False: every bound -149, so the attempt only observes), agrees, runs
        every micro-batch once and all-reduces; when no add broke the grid
        the step is done in one pass, else attempt 2 states the observed
        exponents (they hold: the partials are recomputed bit for bit) and
        runs the micro-batches again. Then :meth:`finish` (:attr:`history`
        updated), ``self.passes`` := 1 or 2. The gradients are a function of
        the data and the history (itself a function of the data): the same
        bits on every layout. Failures (docs/faults.md): an exception of this
        rank (``failed``: one it had before the step; ``begin``; the
        closure) is agreed over comm before the grid's agreement and before
        the words' all-reduce (one small MAX all-reduce each; under expert
        parallelism the EP group's status step ends each pass), then raised
        on this rank; the other ranks raise :class:`PeerFailedError`. So no
        rank is left waiting in a collective. Under expert parallelism the largest gradient
        exponent of the other ranks' experts joins the bounds' rule (one
        small MAX all-reduce over comm). Returns the closure's results of
        the pass that stood."""
        hist = self._history if use_history else None
        bounds = self._gr.stated_bounds(hist, self._top(hist, comm))
        if hist is not None and self._npeer:
            bounds = self._peer_bounds(bounds, comm)
        for attempt in (0, 1):
            err = failed
            if err is None:
                try:
                    self.begin(n_targets, bounds=bounds, flag_overflow=attempt == 0)
                except Exception as e:  # noqa: BLE001 - agreed, then raised again
                    err = e
            # a rank that failed meets the others before each collective (docs/faults.md)
            self._agree_status(comm, err, "the grid's agreement")
            self.agree(comm)
            out = None
            try:
                out = self._run_all(closure, micro_batches)
            except Exception as e:  # noqa: BLE001
                err = e
            err = self._ep_pass_end(err)
            self._agree_status(comm, err, "the gradients' all-reduce")
            if not self.allreduce(comm):
                break
            if attempt == 1:  # not reached: the flag is off in attempt 2 (an add would raise)
                raise self._overflow_error("GradReduction.run_step")
            bounds = self._observed
        self.finish(comm)
        self.passes = attempt + 1
        return out

    def _agree_status(self, comm, err, before):
        """One MAX all-reduce of one int64 over comm, this rank's status
        (docs/faults.md): level << 40 | (2^40 - 1 - rank), level 2 for this
        rank's own failure, 1 for one learned from a peer (PeerFailedError),
        0 fine; the MAX names the rank that reports. Raises err on that rank,
        PeerFailedError on the others."""
        fn, rank = self._fw_comm(comm)
        top = 1 << 40
        level = 0 if err is None else 1 if isinstance(err, PeerFailedError) else 2
        v = (level << 40) | (top - 1 - rank) if level else 0
        if fn is not None:
            buf = bytearray(int(v).to_bytes(8, _sys.byteorder, signed=True))
            r = fn(buf, "max")
            v = int.from_bytes(bytes(buf if r is None else r), _sys.byteorder, signed=True)
        if not v:
            return
        who = top - 1 - (v & (top - 1))
        if err is not None and who == rank:
            raise err
        raise PeerFailedError(f"rank {who} failed before {before}")

    def _ep_pass_end(self, err):
        """Under expert parallelism, the EP group's status step after the
        pass (glm_moe.h glm_ep_status): every rank's status word to every
        peer, so a rank that failed between two row exchanges meets the
        others at the exchange they wait in (its drain); a failure learned
        from a peer's status needs none. Returns the pass's error (or a
        PeerFailedError learned here)."""
        ep = self._ep
        if ep is None or getattr(ep, "E", 1) <= 1:
            return err
        if err is not None and "expert parallelism: EP rank " in str(err):
            # learned from a peer's status word (glm_ep_status): the group knows, no drain
            return err if isinstance(err, PeerFailedError) else PeerFailedError(str(err))
        send = bytearray((-1 if err is not None else 0).to_bytes(8, _sys.byteorder, signed=True) * ep.E)
        recv = bytearray(8 * ep.E)
        ep.alltoall_i64(send, recv)
        if err is not None:
            return err
        for p in range(ep.E):
            if int.from_bytes(bytes(recv[8 * p:8 * p + 8]), _sys.byteorder, signed=True) < 0:
                return PeerFailedError(f"expert parallelism: EP rank {p} failed")
        return None

    def _top(self, hist, comm):
        """Under expert parallelism with a history: the largest gradient
        exponent of the whole model's history (this rank's MAX all-reduced
        over comm: the other ranks hold other experts); None otherwise."""
        if self._ep is None or hist is None:
            return None
        top = max(hist[:-1], default=-149)
        fn, _ = self._fw_comm(comm)
        if fn is None:
            return top
        buf = bytearray(int(top).to_bytes(8, _sys.byteorder, signed=True))  # one int64 word
        r = fn(buf, "max")
        return int.from_bytes(bytes(buf if r is None else r), _sys.byteorder, signed=True)

    def _run_all(self, closure, micro_batches):
        out = []
        for i, (b, n) in enumerate(micro_batches):
            with self.micro_batch(b, n):
                out.append(closure(i))
        return out

    @property
    def current_micro_batch(self):
        """The :class:`MicroBatch` whose ``with micro_batch(...)`` block
        runs (e.g. inside a :meth:`run_step` closure: its
        ``token_losses``), or None."""
        return self._mb

    @_contextlib.contextmanager
    def micro_batch(self, first_token, num_tokens):
        """The bitexact modules called inside hold the micro-batch of global
        tokens [first_token, first_token + num_tokens) (whole sequences)."""
        if self.phase == "stated":
            raise InvalidArgumentError("GradReduction.micro_batch: the stated grid is not agreed "
                                       "yet (phase 'stated'): agree() first, then the "
                                       "micro-batches once")
        if self.phase not in ("bound", "add"):
            raise InvalidArgumentError(f"GradReduction.micro_batch: no pass is running (phase "
                                       f"'{self.phase}'): begin() first")
        if _active() is not None:
            raise InvalidArgumentError("GradReduction.micro_batch: already inside a micro_batch")
        b, n = int(first_token), int(num_tokens)
        if n < 1:
            raise InvalidArgumentError(f"GradReduction.micro_batch: num_tokens {n} must be >= 1")
        try:  # not whole chunks; pass 1 not repeating pass 0's micro-batches in order
            c0 = self._gr.micro_batch(b, n)
        except Error as e:
            raise _renamed(e, self._names_for(e), "GradReduction.micro_batch") from e
        self._mb = MicroBatch(self, b, n, c0)
        _tls.red = self
        try:
            yield self._mb
        finally:
            _tls.red = None
            self._mb = None

    def count_targets(self, targets, ignore_index=-100, comm=None):
        """The global count of targets != ignore_index (int64, order-free):
        the local count (bx_xent_count) summed over ranks through comm."""
        t = self._fw_targets("GradReduction.count_targets", targets)
        counts = self._fw_empty_i64(1)
        _k.xent_count(t, max(int(t.shape[0]), 1), counts, ignore_index=ignore_index)
        buf = bytearray(self._fw_bytes(counts))
        fn, _ = self._fw_comm(comm)
        if fn is not None:
            r = fn(buf, "sum")
            if r is not None:
                buf = bytearray(r)
        return int.from_bytes(bytes(buf), "little", signed=True)

    def _require(self, phase, what):
        phases = (phase,) if isinstance(phase, str) else phase
        if self.phase not in phases:
            if self.phase == "overflowed":
                raise self._overflow_error(f"GradReduction.{what}")
            want = " or ".join(f"'{p}'" for p in phases)
            raise InvalidArgumentError(f"GradReduction.{what}: called in phase '{self.phase}', "
                                       f"expected {want} (two passes: begin, micro-batches, "
                                       "agree, the same micro-batches, finish; one pass: "
                                       "begin(bounds=...), agree, micro-batches, allreduce, "
                                       "finish)")

    def _fw_comm(self, comm):
        return _comm_args(comm)


class PeerFailedError(Error):
    """Another rank failed (and reports it): raised on the ranks that
    learned it from an agreement (docs/faults.md)."""


class MicroBatch:
    """What a module's forward captures: the reduction, its generation (the
    pass), the micro-batch's tokens and first global chunk, and the
    parameters already used in it."""

    def __init__(self, red, first_token, num_tokens, first_chunk):
        self.red, self.gen = red, red._gen
        self.tok0, self.T, self.chunk0 = first_token, num_tokens, first_chunk
        self.used = set()
        self.loss_used = False
        self.token_losses = None  # cross_entropy's per-token losses [T] (fp32), when called

    def take(self, fn, param, name, rows, exact):
        """The state index of param, checked: rows of its input = the
        micro-batch's tokens (exact) or a multiple (rows per token),
        registered, used once."""
        red = self.red
        if (rows != self.T) if exact else (rows % self.T):
            raise _err(InvalidArgumentError, fn, "input", f"has {rows} token rows, the "
                       f"micro-batch holds {self.T} tokens{'' if exact else ' (or a multiple)'}")
        i = red._index.get(id(param))
        if i is None:
            raise _err(InvalidArgumentError, fn, name, "requires grad but is not a parameter of "
                       "the active GradReduction")
        if i in self.used:
            raise _err(InvalidArgumentError, fn, name, f"({red.names[i]}) is used twice in one "
                       "micro-batch: its chunk partials would be added twice (not supported)")
        self.used.add(i)
        return i

    def check(self, what):
        """Before a backward does any work: its pass must still run. True
        in pass 0 (bound), False in pass 1 (add)."""
        red = self.red
        if red._gen != self.gen:
            raise InvalidArgumentError(f"{what}: this backward belongs to a finished pass of the "
                                       f"GradReduction (now in phase '{red.phase}'): run the "
                                       "backward inside its own pass")
        return red.phase == "bound"


def capture(fn, weights, trainable, doc, exact=True):
    """At forward: the micro-batch and the state indices of the weights
    (w, name, rows) for which trainable(w) (None where not). No reduction
    active and a trainable weight: an error (gradients of bitexact modules
    go through a GradReduction; doc names the page)."""
    flags = [bool(trainable(w)) for w, _, _ in weights]
    if not any(flags):
        return None, [None] * len(weights)
    red = _active()
    if red is None:
        name = next(n for (w, n, _), f in zip(weights, flags) if f)
        raise _err(InvalidArgumentError, fn, name, "requires grad, but no GradReduction "
                   f"micro_batch is active (bitexact modules add weight gradients to it; {doc})")
    mb = red._mb
    used = set(mb.used)
    try:
        return mb, [mb.take(fn, w, n, rows, exact) if f else None
                    for (w, n, rows), f in zip(weights, flags)]
    except Error:  # all or nothing: a refused weight undoes the ones registered before it
        mb.used.clear()
        mb.used.update(used)
        raise


@_contextlib.contextmanager
def all_or_nothing(mb, idx=(), loss=False):
    """Around an op's apply whose kernel may still refuse the data (token
    ids, targets out of range): on an error the op's registrations in the
    micro-batch (the state indices idx, the loss) are undone, so the
    failed call changes nothing."""
    try:
        yield
    except BaseException:
        if mb is not None:
            mb.used.difference_update(i for i in idx if i is not None)
            if loss:
                mb.loss_used = False
        raise


def node_grads(mb, what):
    """A node's ``grads`` argument (bitexact._core.glm_*_backward): None
    without a micro-batch, else (state, pass, first token, first chunk),
    after checking that the micro-batch's pass still runs."""
    if mb is None:
        return None
    bound = mb.check(what)
    return (mb.red._gr, 0 if bound else 1, mb.tok0, mb.chunk0)


@_contextlib.contextmanager
def named(mb):
    """Around a node call: a state error's 'tensor i' followed by the
    parameter's name."""
    try:
        yield
    except Error as e:
        if mb is None:
            raise
        raise _renamed(e, mb.red._names_for(e)) from e


__all__ = ["GradReductionBase", "MicroBatch", "capture", "node_grads", "named"]
