"""Gang-aware preemption over time: one plan per gang (made, kept, acted on, ended).

kube-scheduler chooses victims pod by pod; this package owns what is evicted for a gang, checks
that the line would then admit it, remembers whom each victim made room for, and wakes the
preemptor once the victims are gone. The rules it applies are in app/core/preemption/."""
