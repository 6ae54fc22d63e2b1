"""A reference for pgqueue's cron patterns: Debian (Vixie) cron's meaning, by brute force.

Written apart from the product (src/cron.rs), to check it (tests/cron_reference.rs):

- random 5- and 6-field patterns, in zones with DST (northern, southern, 30-minute shifts,
  a 2-hour shift, a negative one, transitions at midnight), from times concentrated around
  their transitions;
- for each, the slots in a window after that time, found by walking every real minute (a
  wildcard job) or every wall-clock minute (a fixed-time job) and testing each against the
  pattern's sets; and, for 5-field patterns, what cronsim (a PyPI package that follows Debian's
  cron) gives.

Prints one JSON object a line. Time zones come from the tzdata package (PYTHONTZPATH is
emptied), so both sides use the same release of the IANA database.
"""

import argparse
import json
import random
import signal
import sys
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import cronsim
import tzdata

ZONES = [
    "Europe/Berlin", "America/New_York", "America/St_Johns", "Australia/Lord_Howe",
    "Australia/Sydney", "Australia/Adelaide", "Pacific/Chatham", "America/Santiago",
    "America/Havana", "Pacific/Auckland", "Europe/London", "Europe/Dublin", "Antarctica/Troll",
    "America/Asuncion", "Asia/Jerusalem", "America/Godthab", "Asia/Kathmandu", "UTC",
]
NAMES = {
    "month": ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"],
    "dow": ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
}
# (name, lowest, highest) of each field, seconds first.
FIELDS = [("second", 0, 59), ("minute", 0, 59), ("hour", 0, 23), ("dom", 1, 31), ("month", 1, 12), ("dow", 0, 7)]
SLOTS = 8
WINDOW = timedelta(hours=36)
UTC = timezone.utc


# --- the pattern's sets ---------------------------------------------------------------------

def value(text, field):
    names = NAMES.get(field[0], [])
    if text.upper() in names:
        return names.index(text.upper()) + (1 if field[0] == "month" else 0)
    return int(text)


def values(text, field):
    """The set a field's text names (Vixie: lists of values, ranges, steps on `*` or a range)."""
    _, lo, hi = field
    out = set()
    for part in text.split(","):
        base, _, step = part.partition("/")
        step = int(step) if step else 1
        if base == "*":
            first, last = lo, hi
        elif "-" in base:
            a, b = base.split("-")
            first, last = value(a, field), value(b, field)
        else:
            first = last = value(base, field)
        out.update(range(first, last + 1, step))
    if field[0] == "dow" and 7 in out:
        out.discard(7)
        out.add(0)
    return out


class Pattern:
    def __init__(self, text):
        fields = text.split()
        self.with_seconds = len(fields) == 6
        if not self.with_seconds:
            fields = ["0"] + fields
        self.sets = [values(t, f) for t, f in zip(fields, FIELDS)]
        self.seconds = sorted(self.sets[0])
        # Vixie: both day fields must match when either begins with a star.
        self.day_and = fields[3].startswith("*") or fields[5].startswith("*")
        # Debian: a wildcard job's minute or hour begins with a star.
        self.wildcard = fields[1].startswith("*") or fields[2].startswith("*")

    def ever(self):
        """Whether some day matches (a 31st of June never does; a weekday falls on any date)."""
        _, _, _, doms, months, dows = self.sets
        if not self.day_and and dows != set(range(7)):
            return True
        longest = {2: 29, 4: 30, 6: 30, 9: 30, 11: 30}
        return any(d <= longest.get(m, 31) for m in months for d in doms)

    def minute_matches(self, w):
        """Whether the wall-clock minute `w` (naive) has slots (at `self.seconds`)."""
        _, minutes, hours, doms, months, dows = self.sets
        if w.minute not in minutes or w.hour not in hours or w.month not in months:
            return False
        dom, dow = w.day in doms, (w.weekday() + 1) % 7 in dows
        return (dom and dow) if self.day_and else (dom or dow)


# --- slots by brute force -------------------------------------------------------------------

def wall(t, zone):
    return datetime.fromtimestamp(t, zone).replace(tzinfo=None)


def real(w, zone):
    """The instants (epoch seconds) whose wall-clock time in `zone` is `w`."""
    found = set()
    for fold in (0, 1):
        t = int(w.replace(tzinfo=zone, fold=fold).timestamp())
        if wall(t, zone) == w:
            found.add(t)
    return sorted(found)


def after_gap(w, zone):
    """The first instant after the gap that skips the wall-clock time `w`."""
    t = int(w.replace(tzinfo=zone, fold=1).timestamp())  # by the later offset: before the gap
    while wall(t, zone) < w:
        t += 60
    while wall(t - 1, zone) > w:
        t -= 1
    return t


def slots(p, zone, start, end):
    """Up to SLOTS slots in (start, end], epoch seconds."""
    out = []
    if p.wildcard:
        # Every real minute: a slot where its wall clock matches.
        t = start - start % 60
        while t <= end and len(out) < SLOTS:
            if p.minute_matches(wall(t, zone)):
                out += [t + s for s in p.seconds if start < t + s <= end]
            t += 60
        return out[:SLOTS]
    # Every wall-clock minute (from well before the start): each slot at its first instant,
    # a skipped one at the end of the gap, each instant once.
    w = wall(start, zone).replace(second=0) - timedelta(hours=4)
    last = wall(end, zone) + timedelta(hours=4)
    while w <= last and len(out) < SLOTS:
        if p.minute_matches(w):
            for s in p.seconds:
                ws = w + timedelta(seconds=s)
                found = real(ws, zone)
                t = found[0] if found else after_gap(ws, zone)
                if start < t <= end and t not in out:
                    out.append(t)
        w += timedelta(minutes=1)
    return sorted(out)[:SLOTS]


class Stuck(Exception):
    pass


def on_alarm(_signal, _frame):
    raise Stuck()


def by_cronsim_in_time(text, zone, start, end, seconds=5):
    """cronsim's slots, or None if it takes longer than `seconds`: it loops forever on some
    valid patterns (a day-of-week range ending at 7 with a step, as in `7-7/4`), and a second
    opinion must not hang the test."""
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        return by_cronsim(text, zone, start, end)
    except Stuck:
        print(f"cronsim gave no answer for {text!r} in {zone.key} within {seconds} s: left out", file=sys.stderr)
        return None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def by_cronsim(text, zone, start, end):
    it = cronsim.CronSim(text, datetime.fromtimestamp(start, zone))
    out = []
    for _ in range(2000):
        try:
            t = int(next(it).timestamp())
        except StopIteration:
            break
        if t > end or len(out) == SLOTS:
            break
        # cronsim walks a fixed-time job's wall clock: from the second pass of a repeated
        # hour it returns first instants before the start, and it returns the end of a gap
        # once for each time the gap skips.
        if t > start and t not in out:
            out.append(t)
    return out


def midnight_change(zone, changes, start, end):
    """Whether the clock changes at midnight between `start` and `end` (America/Havana,
    America/Santiago). cronsim departs from Debian's cron there for wildcard jobs: it runs them
    at the first instant after a skipped midnight hour as if it were midnight, and misses
    real instants in the hour after it."""
    at_midnight = lambda w: (w.hour, w.minute, w.second) == (0, 0, 0)
    return any(
        start - 3600 <= t <= end and (at_midnight(wall(t, zone)) or at_midnight(wall(t - 1, zone) + timedelta(seconds=1)))
        for t in changes
    )


# --- random cases ---------------------------------------------------------------------------

def transitions(zone):
    """The instants its UTC offset changes, 2025-2030."""
    out = []
    t, stop = int(datetime(2025, 1, 1, tzinfo=UTC).timestamp()), int(datetime(2031, 1, 1, tzinfo=UTC).timestamp())
    offset = lambda x: datetime.fromtimestamp(x, zone).utcoffset()
    while t < stop:
        if offset(t) != offset(t + 10800):
            lo, hi = t, t + 10800
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if offset(mid) == offset(lo) else (lo, mid)
            out.append(hi)
        t += 10800
    return out


def field_text(rng, field, dst_hours=()):
    name, lo, hi = field
    kind = rng.random()
    if kind < 0.25:
        return "*"
    if kind < 0.4:
        return f"*/{rng.randint(2, max(2, (hi - lo) // 2))}"
    pick = lambda: rng.choice(list(dst_hours)) if dst_hours and rng.random() < 0.6 else rng.randint(lo, hi)
    if kind < 0.55:
        return str(pick())
    if kind < 0.75:
        return ",".join(str(v) for v in sorted({pick() for _ in range(rng.randint(2, 4))}))
    a = pick()
    b = rng.randint(a, min(hi, a + rng.randint(0, (hi - lo) // 2)))
    return f"{a}-{b}/{rng.randint(2, 5)}" if kind < 0.9 else f"{a}-{b}"


def pattern_text(rng, with_seconds):
    sec = field_text(rng, FIELDS[0]) if with_seconds else None
    minute = field_text(rng, FIELDS[1])
    hour = field_text(rng, FIELDS[2], dst_hours=(0, 1, 2, 3, 23))
    dom = "*" if rng.random() < 0.5 else field_text(rng, FIELDS[3])
    month = "*" if rng.random() < 0.75 else field_text(rng, FIELDS[4])
    r = rng.random()
    if r < 0.5:
        dow = "*"
    elif r < 0.65:
        dow = rng.choice(["MON-FRI", "SAT,SUN", "sun", "1-7", "5-7", "*/2", "0-6/3", "TUE"])
    else:
        dow = field_text(rng, FIELDS[5])
    fields = [minute, hour, dom, month, dow]
    return " ".join(([sec] if with_seconds else []) + fields)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--cases", type=int, default=2000)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    print(json.dumps({"tzdata": tzdata.IANA_VERSION, "cronsim": getattr(cronsim, "__version__", "")}))
    zones = {name: (ZoneInfo(name), transitions(ZoneInfo(name))) for name in ZONES}
    for _ in range(args.cases):
        name = rng.choice(ZONES)
        zone, changes = zones[name]
        around = rng.choice(changes) if changes else int(datetime(2027, 6, 1, tzinfo=UTC).timestamp())
        r = rng.random()
        if r < 0.6:
            start = around + rng.randint(-3 * 3600, 3 * 3600)
        elif r < 0.9:
            start = around + rng.randint(-2 * 86400, 2 * 86400)
        else:
            start = around + rng.randint(-200 * 86400, 200 * 86400)
        if rng.random() < 0.3:
            start -= start % 60  # on a minute, often a slot itself
        while True:
            text = pattern_text(rng, with_seconds=rng.random() < 0.35)
            p = Pattern(text)
            if p.ever():
                break
        end = start + int(WINDOW.total_seconds())
        case = {"pattern": text, "zone": name, "after": start, "until": end, "slots": slots(p, zone, start, end)}
        if not p.with_seconds and not (p.wildcard and midnight_change(zone, changes, start, end)):
            answer = by_cronsim_in_time(text, zone, start, end)
            if answer is not None:
                case["cronsim"] = answer
        print(json.dumps(case), flush=True)


if __name__ == "__main__":
    main()
