"""Cron schedules for ``spec.backup.schedule``: parsed, checked, and the next time due.

No cron library is a dependency of the operator, and the subset a backup schedule
needs is small, so it is parsed here: five fields (minute hour day-of-month month
day-of-week, as crontab(5)) or six with seconds first (as CloudNativePG's
ScheduledBackup, after Go's robfig/cron). Each field is ``*``, a number, a range
``a-b``, any of those with a step ``/n``, or a comma-separated list of them; day of
week 0-7 (0 and 7 are Sunday). No names (``MON``, ``JAN``) and no ``@daily``
shorthands: ``parse`` refuses them with a message, so a typo is an error at admission
(the CRD's pattern) or in the status (``refused_archive``), never a schedule that
silently never fires. Where both day fields are restricted a day matches either
(Vixie cron's rule). Times are UTC.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

# (low, high) of each field, in the six-field order.
_RANGES = ((0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_NAMES = ("second", "minute", "hour", "day of month", "month", "day of week")
# How far ahead a next time is looked for: Feb 29 on a Monday can be 28 years away.
_HORIZON_DAYS = 366 * 29


@dataclass(frozen=True)
class Schedule:
    """A parsed schedule: the values each field allows."""

    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 Sunday .. 6 Saturday
    any_day: bool  # day of month was ``*``
    any_weekday: bool  # day of week was ``*``

    def _day_matches(self, day: datetime.date) -> bool:
        if day.month not in self.months:
            return False
        by_date = day.day in self.days
        by_weekday = (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return by_date and by_weekday
        return by_date or by_weekday

    def next_after(self, after: datetime.datetime) -> datetime.datetime:
        """The first time strictly after ``after`` (aware, or naive UTC) the schedule fires."""
        if after.tzinfo is None:
            after = after.replace(tzinfo=datetime.UTC)
        start = after.astimezone(datetime.UTC).replace(microsecond=0) + datetime.timedelta(
            seconds=1
        )
        day = start.date()
        for _ in range(_HORIZON_DAYS):
            if self._day_matches(day):
                first = start.time() if day == start.date() else datetime.time(0, 0, 0)
                found = self._first_time_in_day(first)
                if found is not None:
                    return datetime.datetime.combine(day, found, tzinfo=datetime.UTC)
            day += datetime.timedelta(days=1)
        raise ValueError("the schedule never fires")

    def _first_time_in_day(self, first: datetime.time) -> datetime.time | None:
        for hour in sorted(h for h in self.hours if h >= first.hour):
            for minute in sorted(self.minutes):
                if (hour, minute) < (first.hour, first.minute):
                    continue
                floor = first.second if (hour, minute) == (first.hour, first.minute) else 0
                second = min((s for s in self.seconds if s >= floor), default=None)
                if second is not None:
                    return datetime.time(hour, minute, second)
        return None


def parse(expression: str) -> Schedule:
    """``expression`` parsed; ValueError naming the field and what is wrong with it."""
    fields = expression.split()
    if len(fields) == 5:
        fields = ["0", *fields]
    elif len(fields) != 6:
        raise ValueError(
            f"a schedule has 5 fields (minute hour day month weekday) or 6 (seconds "
            f"first), not {len(fields)}: {expression!r}"
        )
    values = [_field(f, name, r) for f, name, r in zip(fields, _NAMES, _RANGES, strict=True)]
    weekdays = frozenset(d % 7 for d in values[5])
    return Schedule(
        seconds=values[0],
        minutes=values[1],
        hours=values[2],
        days=values[3],
        months=values[4],
        weekdays=weekdays,
        any_day=fields[3] == "*",
        any_weekday=fields[5] == "*",
    )


def refused(expression: str) -> str | None:
    """Why ``expression`` is not a schedule, or None."""
    try:
        parse(expression).next_after(datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC))
    except ValueError as exc:
        return str(exc)
    return None


def _field(text: str, name: str, bounds: tuple[int, int]) -> frozenset[int]:
    low, high = bounds
    out: set[int] = set()
    for part in text.split(","):
        out |= _part(part, name, low, high)
    return frozenset(out)


def _part(part: str, name: str, low: int, high: int) -> set[int]:
    base, _, step_text = part.partition("/")
    step = _number(step_text, name) if step_text else 1
    if step < 1:
        raise ValueError(f"{name}: a step must be at least 1 ({part!r})")
    if base == "*":
        first, last = low, high
    elif "-" in base:
        a, _, b = base.partition("-")
        first, last = _number(a, name), _number(b, name)
    else:
        first = _number(base, name)
        last = high if step_text else first
    if not low <= first <= last <= high:
        raise ValueError(f"{name}: {part!r} is outside {low}-{high} (or a range runs backwards)")
    return set(range(first, last + 1, step))


def _number(text: str, name: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{name}: {text!r} is not a number (names and @shorthands are not taken)")
    return int(text)
