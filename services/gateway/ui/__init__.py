"""Corral's web UI, served by the gateway at /ui: server-rendered Jinja2
shells (templates/), one vanilla script and one stylesheet (static/) that
read the gateway's /v1 API from the browser and stay live from its event
stream. No build step and nothing fetched from the internet at run time."""
