"""The Space Builder: legal schedules of an operator on a target, as MetaSchedule sketches plus decisions."""
