"""HCL2 as Nomad's jobspec2 reads it: the native syntax (`parser`), values
and type constraints (`types`), expression evaluation (`evaluate`), Nomad's
function library (`functions`), input variables and locals (`variables`) and
the evaluation of a whole job file with its dynamic blocks (`config`)."""
