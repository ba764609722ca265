"""Nomad's `/v1` endpoints, one module per object; each exports `ROUTES`
(a list of Starlette routes) and `services/gateway/app.py` lists the
modules."""
