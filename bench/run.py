#!/usr/bin/env python3
"""Run every memsnap benchmark, print one table, rewrite bench/README.md.

Called by `make bench` (after `make build`, so .venv holds the memsnap
package and torch):  bench/run.py --build build-bench --readme bench/README.md

Each row names its anchor (what it is compared with) and its goal; figures
are shown side by side with their ratio.  A row whose parts are missing
(e.g. the real inputs, or a component not built) says why instead of a
figure.  memsnap and its anchor run interleaved -- round by round, in
turn, in the same run -- and every figure is the median of its rounds;
where the machine is shared, the programs time thread (or process) CPU
time too, which time spent waiting for a core does not inflate.  Nothing
here is a test.
"""
import argparse
import datetime
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, 'out')
BEGIN = '<!-- bench:table:begin -->'
END = '<!-- bench:table:end -->'
PROGRAMS = ['bench_hotpath', 'bench_history', 'bench_dump', 'bench_clock',
            'bench_trace_memory', 'bench_gen_snapshot', 'bench_replay',
            'bench_read']


class Skip(Exception):
    """A row cannot run here; the message says why."""


def log(msg):
    print('bench: ' + msg, file=sys.stderr, flush=True)


def run(cmd, timeout=1800, env=None, cwd=None):
    log('$ ' + ' '.join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=env, cwd=cwd)
    if p.returncode != 0:
        raise Skip('%s failed (exit %d): %s' % (
            os.path.basename(cmd[0]), p.returncode,
            (p.stderr or p.stdout).strip().splitlines()[-1:]))
    return p.stdout


def results(text):
    """RESULT key=value lines -> dict of floats (or strings)."""
    out = {}
    for m in re.finditer(r'^RESULT (\w+)=(\S+)', text, re.M):
        try:
            out[m.group(1)] = float(m.group(2))
        except ValueError:
            out[m.group(1)] = m.group(2)
    return out


def timed(cmd, timeout=3600, env=None):
    """Run cmd under /usr/bin/time -v: (seconds, peak RSS bytes, stdout)."""
    secs, _, rss, out = timed_cpu(cmd, timeout=timeout, env=env)
    return secs, rss, out


def timed_cpu(cmd, timeout=7200, env=None):
    """Run cmd under /usr/bin/time -v: (wall s, CPU s = user + sys, peak RSS
    bytes, stdout)."""
    if not os.path.exists('/usr/bin/time'):
        raise Skip('/usr/bin/time missing (make deps-quality)')
    with tempfile.NamedTemporaryFile('r', suffix='.time') as tf:
        full = ['/usr/bin/time', '-v', '-o', tf.name] + cmd
        log('$ ' + ' '.join(cmd))
        t0 = time.perf_counter()
        p = subprocess.run(full, capture_output=True, text=True,
                           timeout=timeout, env=env)
        secs = time.perf_counter() - t0
        info = tf.read()
    if p.returncode != 0:
        raise Skip('%s failed (exit %d): %s' % (
            ' '.join(cmd[:3]), p.returncode,
            (p.stderr or p.stdout).strip().splitlines()[-1:]))
    def field(name):
        m = re.search(name + r': ([0-9.]+)', info)
        return float(m.group(1)) if m else 0.0
    cpu = field(r'User time \(seconds\)') + field(r'System time \(seconds\)')
    rss = int(field(r'Maximum resident set size \(kbytes\)')) * 1024
    return secs, cpu, rss, p.stdout


def median(v):
    v = sorted(v)
    n = len(v)
    return (v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2) if n \
        else 0.0


def parse_kv(line):
    """'a=1 b=2' -> {'a': 1.0, 'b': 2.0}."""
    out = {}
    for tok in line.split():
        k, _, v = tok.partition('=')
        try:
            out[k] = float(v)
        except ValueError:
            out[k] = v
    return out


class Server:
    """A program that prints "ready", then answers each line it reads on
    stdin with one "key=value ..." line (bench_dump and pickle_dump.py
    --serve): the runner alternates two of them, round by round."""

    def __init__(self, cmd, timeout=3600):
        log('$ ' + ' '.join(cmd))
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        self.name = os.path.basename(cmd[0])
        line = self.p.stdout.readline()
        if line.strip() != 'ready':
            err = self.p.stderr.read() if self.p.poll() is not None else ''
            self.p.kill()
            raise Skip('%s did not start: %s' % (
                self.name, (err or line).strip().splitlines()[-1:]))

    def ask(self):
        self.p.stdin.write('go\n')
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise Skip('%s stopped: %s' % (
                self.name, self.p.stderr.read().strip().splitlines()[-1:]))
        return parse_kv(line)

    def close(self):
        self.p.stdin.close()
        out = self.p.stdout.read()
        self.p.wait(timeout=600)
        return results(out)


def fmt_ns(ns):
    return '%.0f ns' % ns if ns >= 10 else '%.1f ns' % ns


def fmt_s(s):
    if s < 0.1:
        return '%.2f ms' % (s * 1e3)
    return '%.3f s' % s if s < 10 else '%.1f s' % s


def fmt_bytes(b):
    for unit, k in (('GB', 1e9), ('MB', 1e6), ('kB', 1e3)):
        if b >= k:
            return '%.1f %s' % (b / k, unit)
    return '%d B' % b


def ratio(a, b):
    return '%.2fx' % (a / b) if b else 'n/a'


class Bench:
    def __init__(self, args):
        self.args = args
        self.build = os.path.abspath(args.build)
        self.py = args.python
        self.real = os.path.abspath(args.real)
        self.big = None
        os.makedirs(OUT, exist_ok=True)

    def prog(self, name):
        path = os.path.join(self.build, 'bench', name)
        if not os.path.exists(path):
            raise Skip('%s not built' % name)
        return path

    def memsnap_cli(self):
        for cand in (os.path.join(self.build, 'tools', 'memsnap'),
                     shutil.which('memsnap') or ''):
            if cand and os.path.exists(cand):
                return cand
        raise Skip('memsnap CLI not built')

    def real_files(self):
        if not os.path.isdir(self.real):
            raise Skip('real inputs missing at %s' % self.real)
        files = [os.path.join(self.real, f) for f in os.listdir(self.real)
                 if f.endswith(('.pickle', '.pkl'))]
        if not files:
            raise Skip('no snapshot files in %s' % self.real)
        return files

    # -- rows ---------------------------------------------------------------
    def row_hotpath(self):
        sizes = os.path.join(OUT, 'sizes.txt')
        origin = run([sys.executable, os.path.join(HERE, 'sizes.py'), sizes,
                      self.real]).strip()
        r = results(run([self.prog('bench_hotpath'), sizes,
                         str(self.args.rounds)]))
        m, g, mi = r['memsnap_ns'], r['glibc_ns'], r['mimalloc_ns']
        rows = [dict(
            name='hot path: cached malloc+free pair, history off (%s; '
                 'thread CPU time, median of %d interleaved rounds)'
                 % (origin, r['rounds']),
            anchor='glibc %s / mimalloc %s' % (fmt_ns(g), fmt_ns(mi)),
            value=fmt_ns(m),
            ratio='%s of glibc, %s of mimalloc' % (ratio(m, g), ratio(m, mi)),
            goal='<= 100 ns and <= mimalloc',
            met=m <= 100 and m <= mi)]
        if 'small_memsnap_ns' in r:
            sm, sg, smi = (r['small_memsnap_ns'], r['small_glibc_ns'],
                           r['small_mimalloc_ns'])
            rows.append(dict(
                name='hot path, requests <= 1 MiB only (%d sizes)'
                     % r['sizes_small'],
                anchor='glibc %s / mimalloc %s' % (fmt_ns(sg), fmt_ns(smi)),
                value=fmt_ns(sm),
                ratio='%s of glibc, %s of mimalloc' % (ratio(sm, sg),
                                                       ratio(sm, smi)),
                goal='<= 100 ns and <= mimalloc',
                met=sm <= 100 and sm <= smi))
        return rows

    def row_history(self):
        rows = []
        r = results(run([self.prog('bench_history'),
                         str(self.args.rounds)]))
        off = r['off_ns']
        rows.append(dict(
            name="history overhead per alloc+free pair, C caller: "
                 "context 'all', no stacks (thread CPU time, median of %d "
                 "interleaved rounds)" % r['rounds'],
            anchor='history off %s' % fmt_ns(off),
            value='+' + fmt_ns(r['nostacks_ns'] - off),
            ratio=ratio(r['nostacks_ns'], off), goal='(info)', met=None))
        nost = r['nostacks_ns']
        cst = r['cstacks_ns'] - nost
        if 'cstacks_libunwind_ns' in r:
            lu = r['cstacks_libunwind_ns'] - nost
            rows.append(dict(
                name="C stacks (%d frames deep), added to context 'all': "
                     "memsnap's CFI unwinder (record/unwind.c)"
                     % r['depth'],
                anchor="libunwind's unw_backtrace (the unwinder before): "
                       "+%s" % fmt_ns(lu),
                value='+' + fmt_ns(cst),
                ratio='%s of libunwind' % ratio(cst, lu),
                goal='cheaper than libunwind', met=cst < lu))
        else:
            rows.append(dict(
                name="C stacks (%d frames deep), added to context 'all' "
                     "(unwinder %s)" % (r['depth'], r.get('unwinder', '?')),
                anchor='libunwind not loadable: no anchor',
                value='+' + fmt_ns(cst), ratio='', goal='(info)', met=None))
        try:
            out = run([self.py, os.path.join(HERE, 'history_python.py')],
                      timeout=1800)
            p = results(out)
            # What python stacks add, as the C row: over context 'all'
            # without stacks (torch's anchor is its capture alone, not its
            # trace entries).
            nost = p['nostack_ns']
            over = p['python_ns'] - nost
            frames = p['python_frames']
            rows.append(dict(
                name="history overhead per alloc+free pair through the "
                     "Python package: context 'all', no stacks (thread CPU "
                     "time, median of %d interleaved rounds)" % p['rounds'],
                anchor='history off %s' % fmt_ns(p['off_ns']),
                value='+' + fmt_ns(nost - p['off_ns']),
                ratio=ratio(nost, p['off_ns']), goal='(info)', met=None))
            if 'torch_ns' in p:
                t = p['torch_ns'] - p['calls_ns']
                rows.append(dict(
                    name="python stacks (%d frames recorded) through the "
                         "Python package, added to context 'all' per "
                         "alloc+free pair; steady frames (thread CPU time, "
                         "median of %d interleaved rounds)"
                         % (frames, p['rounds']),
                    anchor="torch's own capture, same process: 2 x "
                           "gather_traceback(python) per pair %s"
                           % fmt_ns(t),
                    value="+%.3f us (context 'all' without stacks %s; "
                          "history off %s: +%.3f us in all)"
                          % (over / 1000, fmt_ns(nost), fmt_ns(p['off_ns']),
                             (p['python_ns'] - p['off_ns']) / 1000),
                    ratio='%s of torch' % ratio(over, t),
                    goal='<= 0.2x torch (and <= 0.2 us on a quiet core: '
                         'not measurable on a shared machine)',
                    met=over <= 0.2 * t))
                fo = p['fresh_python_ns'] - p['fresh_nostack_ns']
                ft = p['fresh_torch_ns'] - p['fresh_calls_ns']
                rows.append(dict(
                    name='same, each pair at the bottom of a new %d-frame '
                         'call chain (fresh frames, as in a training step)'
                         % (p['depth'] - 3),
                    anchor="torch's capture %s (it creates the frame "
                           "objects)" % fmt_ns(ft),
                    value='+%.3f us' % (fo / 1000),
                    ratio='%s of torch' % ratio(fo, ft),
                    goal='<= 0.2x torch (and <= 0.2 us on a quiet core: '
                         'not measurable on a shared machine)',
                    met=fo <= 0.2 * ft))
            else:
                rows.append(dict(
                    name='python stacks (%d frames recorded), added per '
                         'alloc+free pair' % frames,
                    anchor='torch not importable: no anchor',
                    value='+%.3f us' % (over / 1000), ratio='',
                    goal='<= 0.2 us', met=over <= 200))
            if 'all_ns' in p:
                over = p['all_ns'] - nost
                rows.append(dict(
                    name="same, stacks 'all' (python + C, %d frames), "
                         "steady frames" % p['all_frames'],
                    anchor="context 'all' without stacks %s" % fmt_ns(nost),
                    value='+%.3f us' % (over / 1000),
                    ratio=ratio(p['all_ns'], nost),
                    goal='(info)', met=None))
        except Skip as e:
            rows.append(dict(name='history overhead, python stacks',
                             skip=str(e)))
        return rows

    def row_dump(self):
        path = os.path.join(OUT, 'dump-1m.pickle')
        ms = Server([self.prog('bench_dump'), path, '1000000', '--serve'])
        try:
            py = Server([self.py, os.path.join(HERE, 'pickle_dump.py'),
                         path, '--serve'])
        except Skip:
            ms.close()
            raise
        mw, mc, pw, pc = [], [], [], []
        for r in range(self.args.rounds):
            for side in ((ms, py) if r % 2 == 0 else (py, ms)):
                got = side.ask()
                (mw if side is ms else pw).append(got['dump_s'])
                (mc if side is ms else pc).append(got['cpu_s'])
        m, pyr = ms.close(), py.close()
        os.unlink(path)
        w, pwm = median(mw), median(pw)
        c, pcm = median(mc), median(pc)
        return [dict(
            name='snapshot + dump of %d trace entries (C stacks), fsync '
                 'included; median of %d interleaved rounds, wall (CPU)'
                 % (m['entries'], len(mw)),
            anchor='CPython pickle.dump of the same object: %s (%s), %s'
                   % (fmt_s(pwm), fmt_s(pcm), fmt_bytes(pyr['bytes'])),
            value='%s (%s), %s' % (fmt_s(w), fmt_s(c), fmt_bytes(m['bytes'])),
            ratio='time %s (CPU %s), size %s'
                  % (ratio(w, pwm), ratio(c, pcm),
                     ratio(m['bytes'], pyr['bytes'])),
            goal='time <= 0.1x', met=w <= 0.1 * pwm)]

    def big_snapshot(self):
        if self.big is None:
            path = os.path.join(OUT, 'generated-1gb.pickle')
            gen = self.prog('bench_gen_snapshot')
            # made anew when asked, or when the generator was rebuilt
            # after it (a changed generator makes another recording)
            if (not os.path.exists(path) or self.args.regenerate or
                    os.path.getmtime(gen) > os.path.getmtime(path)):
                run([gen, path, str(self.args.big_bytes)], timeout=3600)
            self.big = path
        return self.big

    def check_big(self):
        """The row saying whether the generated recording is consistent
        (memsnap check exits 0), run once for rows 4 and 5."""
        if getattr(self, 'checked', None) is None:
            big = self.big_snapshot()
            cli = self.memsnap_cli()
            u0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            log('$ %s check %s' % (cli, big))
            p = subprocess.run([cli, 'check', big], capture_output=True,
                               text=True)
            u1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime)
            last = (p.stdout.strip().splitlines() or [''])[-1]
            self.checked = dict(
                name='the generated recording (%s, %s) is consistent: '
                     'memsnap check' % (os.path.basename(big),
                                        fmt_bytes(os.path.getsize(big))),
                anchor='(validity of rows 4-5)',
                value='exit %d: %s; %.1f s CPU' % (
                    p.returncode, last.split(': ', 1)[-1][-120:], cpu),
                ratio='', goal='exit 0', met=p.returncode == 0)
            return self.checked
        return None

    def row_reader(self):
        """The reader against a minimal C opcode walk over the same mmap
        (the physical floor), alternating runs, medians; and memsnap check
        on the generated recording (it must pass)."""
        if self.args.no_big:
            raise Skip('--no-big')
        path = self.big_snapshot()
        size = os.path.getsize(path)
        rows = [self.check_big()]
        walk, read = [], []
        prog = self.prog('bench_read')
        for r in range(self.args.rounds):
            # alternate, the order swapped every round
            for mode in (('walk', 'read') if r % 2 == 0 else
                         ('read', 'walk')):
                got = results(run([prog, mode, path]))
                (walk if mode == 'walk' else read).append(got)
        wc = median([w['cpu_s'] for w in walk])
        ww = median([w['wall_s'] for w in walk])
        rc = median([r['cpu_s'] for r in read])
        rw = median([r['wall_s'] for r in read])
        rss = median([r['rss_growth'] for r in read])
        rows.append(dict(
            name='reader (msnap__snap_read_file) on the generated recording '
                 '(%s, %d entries), median of %d alternating rounds'
                 % (fmt_bytes(size), read[0]['entries'], len(read)),
            anchor='C opcode walk over the same mmap: %.3f s CPU (%.2f GB/s), '
                   'wall %.3f s' % (wc, size / wc / 1e9, ww),
            value='%.3f s CPU (%.2f GB/s), wall %.3f s; peak RSS growth %s '
                  '(%.2fx the file)' % (rc, size / rc / 1e9, rw,
                                        fmt_bytes(rss), rss / size),
            ratio='%.2fx the walk (CPU), %.2fx (wall)' % (rc / wc, rw / ww),
            goal='>= 1 GB/s, <= 2x the walk, RSS <= 0.5x the file',
            met=size / rc >= 1e9 and rc <= 2 * wc and rss <= 0.5 * size))
        return rows

    def row_summary(self):
        """memsnap summary against torch's _memory_viz stats, alternating
        runs, medians (of CPU time: the machine may be shared)."""
        cli = self.memsnap_cli()
        rows = []
        inputs = []
        try:
            inputs.append(('largest real input',
                           max(self.real_files(), key=os.path.getsize)))
        except Skip as e:
            rows.append(dict(name='summary vs _memory_viz stats, real input',
                             skip=str(e)))
        if not self.args.no_big:
            inputs.append(('generated recording', self.big_snapshot()))
        _, _, base_rss, _ = timed_cpu([cli, '--version'])
        for label, path in inputs:
            size = os.path.getsize(path)
            big = size > (256 << 20)
            rounds = self.args.viz_rounds if big else self.args.rounds
            mine, theirs = [], []
            ours = [cli, 'summary', path]
            viz = [self.py, '-m', 'torch.cuda._memory_viz', 'stats', path]
            for r in range(rounds):
                # alternate, the order swapped every round
                for cmd in ((ours, viz) if r % 2 == 0 else (viz, ours)):
                    got = timed_cpu(cmd, timeout=7200)
                    (mine if cmd is ours else theirs).append(got)
            # /usr/bin/time counts CPU in 10 ms ticks
            mw, mc = median([m[0] for m in mine]), max(
                median([m[1] for m in mine]), 0.01)
            tw, tc = (median([t[0] for t in theirs]),
                      median([t[1] for t in theirs]))
            mrss = median([m[2] for m in mine])
            trss = median([t[2] for t in theirs])
            rows.append(dict(
                name='summary, %s (%s, %s), %d alternating rounds' % (
                    label, os.path.basename(path), fmt_bytes(size), rounds),
                anchor='torch _memory_viz stats: %s CPU, wall %s, peak RSS %s'
                       % (fmt_s(tc), fmt_s(tw), fmt_bytes(trss)),
                value='%s CPU, wall %s, peak RSS %s (%.2fx the file; process '
                      'baseline %s)' % (fmt_s(mc), fmt_s(mw), fmt_bytes(mrss),
                                        mrss / size, fmt_bytes(base_rss)),
                ratio='%.1fx faster (CPU), %.1fx (wall)' % (tc / mc, tw / mw),
                goal='>= 20x faster' + (', RSS <= 0.5x file' if big else ''),
                met=tc / mc >= 20 and (not big or mrss <= 0.5 * size)))
        return rows

    def row_replay(self):
        cli = self.memsnap_cli()
        rows = []
        cands = []
        try:
            import pickle
            best = None
            for f in self.real_files():
                with open(f, 'rb') as fh:
                    d = pickle.load(fh)
                n = sum(len(t) for t in d.get('device_traces', [])) \
                    if isinstance(d, dict) else 0
                if best is None or n > best[1]:
                    best = (f, n)
            cands.append(('largest real input', best[0]))
        except Skip as e:
            rows.append(dict(name='replay, real input', skip=str(e)))
        if not self.args.no_big:
            big = self.big_snapshot()
            # The generated recording must be consistent (check exits 0):
            # shown once, in row 4 when it ran.
            row = self.check_big()
            if row is not None:
                rows.append(row)
            cands.append(('generated snapshot', big))
        prog = self.prog('bench_replay')
        walker = self.prog('bench_read')
        true = shutil.which('true') or '/bin/true'
        for label, path in cands:
            e2e, e2ec, rd, en, rdc, enc = [], [], [], [], [], []
            start, walk = [], []
            events = 0
            rounds = self.args.rounds if label != 'generated snapshot' \
                else max(3, self.args.rounds // 2)
            for r in range(rounds):
                u0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                t0 = time.perf_counter()
                p = subprocess.run([cli, 'replay', path],
                                   capture_output=True, text=True)
                t = time.perf_counter() - t0
                u1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                e2ec.append(u1.ru_utime + u1.ru_stime - u0.ru_utime -
                            u0.ru_stime)
                if p.returncode not in (0, 1):
                    raise Skip('memsnap replay failed (exit %d): %s' % (
                        p.returncode, p.stderr.strip().splitlines()[-1:]))
                e2e.append(t)
                b = results(run([prog, path, '1']))
                events = int(b['events'])
                # the physical floor of the same round: an empty process
                # (fork + exec + exit) and the opcode walk of the file
                t0 = time.perf_counter()
                subprocess.run([true])
                start.append(time.perf_counter() - t0)
                walk.append(results(run([walker, 'walk', path]))['wall_s'])
                rd.append(b['read_s'])
                en.append(b['engine_s'])
                rdc.append(b['read_cpu_s'])
                enc.append(b['engine_cpu_s'])
            t, tr, te = median(e2e), median(rd), median(en)
            fs, fw = median(start), median(walk)
            bound = 'read' if tr > te else 'engine'
            rows.append(dict(
                name='replay of %s (%s, %d events); median of %d '
                     'interleaved rounds' % (label, os.path.basename(path),
                                             events, rounds),
                anchor='no replay in PyTorch; physical floor: an empty '
                       'process (%s: fork, exec, exit) %s wall + the opcode '
                       'walk of the file %s wall = at most %.2f M events/s'
                       % (true, fmt_s(fs), fmt_s(fw),
                          events / (fs + fw) / 1e6),
                value='end to end %.2f M events/s (%s wall, %s CPU: '
                      'process start and report included); engine %.2f '
                      'M/s (%s wall, %s CPU); read (stacks skipped, as '
                      'replay without -o reads) %.2f M/s (%s wall, %s CPU)'
                      % (events / t / 1e6, fmt_s(t), fmt_s(median(e2ec)),
                         events / te / 1e6,
                         fmt_s(te), fmt_s(median(enc)), events / tr / 1e6,
                         fmt_s(tr), fmt_s(median(rdc))),
                ratio='%s-bound: read %.0f%%, engine %.0f%% of read + '
                      'engine' % (bound, 100 * tr / (tr + te),
                                  100 * te / (tr + te)),
                goal='>= 5 M events/s end to end',
                met=events / t >= 5e6))
        return rows

    def row_clock(self):
        r = results(run([self.prog('bench_clock'), str(self.args.rounds)]))
        return [dict(
            name='clock read (%s); thread CPU time, median of %d '
                 'interleaved rounds' % (r.get('counter', 'cycle counter'),
                                         r['rounds']),
            anchor='clock_gettime(MONOTONIC) %s, REALTIME %s'
                   % (fmt_ns(r['monotonic_ns']), fmt_ns(r['realtime_ns'])),
            value='%s raw, %s to us' % (fmt_ns(r['raw_ns']),
                                        fmt_ns(r['now_us_ns'])),
            ratio=ratio(r['raw_ns'], r['monotonic_ns']),
            goal='(info)', met=None)]

    def row_trace_memory(self):
        r = results(run([self.prog('bench_trace_memory'), '1000000']))
        return [dict(
            name='memory per trace entry, %d entries, no stacks'
                 % r['entries'],
            anchor='(goal)', value='%.1f B' % r['nostacks_bytes'],
            ratio='', goal='<= 32 B', met=r['nostacks_bytes'] <= 32),
            dict(
            name='memory per trace entry, C stacks (interned)',
            anchor='(goal)', value='%.1f B' % r['cstacks_bytes'],
            ratio='', goal='<= 32 B', met=r['cstacks_bytes'] <= 32)]


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    cpu = line.split(':', 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ''
    try:
        with open('/proc/meminfo') as f:
            kb = int(f.readline().split()[1])
            mem = ', %.0f GiB RAM' % (kb / 2**20)
    except (OSError, ValueError, IndexError):
        pass
    cc = subprocess.run(['cc', '--version'], capture_output=True,
                        text=True).stdout.splitlines()[:1]
    return '%s, %d cores%s, Linux %s, %s, Python %s' % (
        cpu, os.cpu_count() or 0, mem, platform.release(),
        cc[0] if cc else 'cc', platform.python_version())


def table(rows):
    lines = ['| # | benchmark | anchor | memsnap | ratio | goal | met |',
             '|---|---|---|---|---|---|---|']
    for r in rows:
        if 'skip' in r:
            lines.append('| %s | %s | | not run: %s | | | |'
                         % (r['n'], r['name'], r['skip']))
            continue
        met = {True: 'yes', False: '**no**', None: ''}[r['met']]
        lines.append('| %s | %s | %s | %s | %s | %s | %s |' % (
            r['n'], r['name'], r['anchor'], r['value'], r['ratio'],
            r['goal'], met))
    return '\n'.join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--build', default=os.path.join(ROOT, 'build-bench'))
    ap.add_argument('--readme', default=None)
    ap.add_argument('--python', default=sys.executable)
    ap.add_argument('--real', default=os.path.join(ROOT, '..', 'shared',
                                                   'real_inputs'))
    ap.add_argument('--rounds', type=int, default=7,
                    help='interleaved rounds per row (medians)')
    ap.add_argument('--viz-rounds', type=int, default=3,
                    help='rounds of the ~1 GB summary vs _memory_viz stats '
                         '(about two minutes each)')
    ap.add_argument('--big-bytes', type=int, default=1 << 30)
    ap.add_argument('--no-big', action='store_true',
                    help='skip the generated ~1 GB snapshot')
    ap.add_argument('--regenerate', action='store_true')
    ap.add_argument('--only', default='', help='comma-separated rows (1-7)')
    args = ap.parse_args()

    # Build the (not-by-default) bench programs that the build knows.
    for name in PROGRAMS:
        subprocess.run(['meson', 'compile', '-C', args.build, name],
                       capture_output=True)
    b = Bench(args)
    plan = [(1, b.row_hotpath), (2, b.row_history), (3, b.row_dump),
            (4, b.row_reader), (4, b.row_summary), (5, b.row_replay),
            (6, b.row_clock), (7, b.row_trace_memory)]
    only = {int(x) for x in args.only.split(',') if x}
    rows = []
    started = datetime.datetime.now()
    load_start = os.getloadavg()[0] if hasattr(os, 'getloadavg') else -1
    for n, fn in plan:
        if only and n not in only:
            continue
        try:
            got = fn()
        except Skip as e:
            log('row %d not run: %s' % (n, e))
            got = [dict(name=fn.__name__[4:], skip=str(e))]
        except Exception as e:  # a broken row must not hide the others
            log('row %d failed: %r' % (n, e))
            got = [dict(name=fn.__name__[4:], skip='error: %r' % e)]
        for r in got:
            r['n'] = n
        rows.extend(got)
    text = table(rows)
    when = started.strftime('%Y-%m-%d %H:%M')
    load_end = os.getloadavg()[0] if hasattr(os, 'getloadavg') else -1
    header = ('Run on %s, on %s (`make bench`, %s).' % (
        when, machine(), 'release build, memsnap and its anchor '
        'interleaved, medians of %d rounds (summary vs _memory_viz stats on '
        'the ~1 GB file: %d)'
        % (args.rounds, args.viz_rounds)))
    if load_start >= 0:
        header += (' Load average (1 min) %.1f at the start, %.1f at the '
                   'end, on %d cores: other jobs shared the machine.'
                   % (load_start, load_end, os.cpu_count() or 0))
    print(header)
    print()
    print(text)
    with open(os.path.join(OUT, 'results.json'), 'w') as f:
        json.dump(dict(when=when, machine=machine(), rows=rows), f, indent=1)
    if args.readme and not args.only:
        with open(args.readme) as f:
            readme = f.read()
        if BEGIN not in readme or END not in readme:
            sys.exit('bench: %s lacks the table markers' % args.readme)
        head, rest = readme.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        with open(args.readme, 'w') as f:
            f.write(head + BEGIN + '\n' + header + '\n\n' + text + '\n' +
                    END + tail)
        log('rewrote the table of %s' % args.readme)
    failed = [r for r in rows if r.get('met') is False]
    log('%d rows, %d goals met, %d missed, %d not run' % (
        len(rows), sum(1 for r in rows if r.get('met') is True), len(failed),
        sum(1 for r in rows if 'skip' in r)))


if __name__ == '__main__':
    main()
