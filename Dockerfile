# One image for the whole cluster, the role chosen by the command (docker-compose.yml): ZooKeeper (Debian's
# ZooKeeper on Java), FlameStream nodes (`python -m flamestream node ...`) and the CLI (`flamestream ...`).
# Steps that download (apt, pip) need a network that reaches the package registries: docker-compose.yml builds
# with the host's network. Spark is not installed (the nodes do not use it; `pip install '.[spark]'` adds it).
# Few steps after the big ones on purpose: with the vfs storage driver every step copies the whole file system.
FROM debian:bookworm-slim

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/flamestream/bin:$PATH
LABEL org.opencontainers.image.title=flamestream
# Graph files such as examples/wordcount.py are resolved from /app, the working directory of every container:
# nodes import the graph's functions from there (examples.wordcount.split_words).
WORKDIR /app

# Python 3.11 in a venv (Debian's own Python is externally managed), Java and Debian's ZooKeeper server
# (libzookeeper-java: the jars without the `zookeeper` package's scripts, whose dependency on the desktop Java
# runtime would add 250 MB; Java's install scripts need /usr/share/man/man1, which slim images leave out). The
# configuration docker-compose.yml runs ZooKeeper with: clients on port 2181 of every interface of the container,
# data in /data, the `srvr` and `ruok` probes, no admin web server, old snapshots purged.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv default-jre-headless libzookeeper-java \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/flamestream \
    && mkdir -p /etc/flamestream \
    && printf '%s\n' tickTime=2000 initLimit=10 syncLimit=5 dataDir=/data/zookeeper clientPort=2181 \
        admin.enableServer=false 4lw.commands.whitelist=ruok,srvr maxClientCnxns=0 \
        autopurge.snapRetainCount=3 autopurge.purgeInterval=1 >/etc/flamestream/zoo.cfg

# The dependencies alone first (the build requirements and dependencies listed in pyproject.toml), so editing the
# sources does not reinstall them. EXTRA_CA_CERTS (PEM) are trusted for these downloads on top of Debian's
# authorities, for networks that intercept TLS; scripts/compose passes the host's own (/usr/local/share/ca-certificates).
ARG EXTRA_CA_CERTS=""
COPY pyproject.toml /tmp/pyproject.toml
RUN python -c 'import tomllib; p = tomllib.load(open("/tmp/pyproject.toml", "rb")); \
        print(*p["build-system"]["requires"], *p["project"]["dependencies"], sep="\n")' >/tmp/requirements.txt \
    && if [ -n "$EXTRA_CA_CERTS" ]; then \
        printf '%s\n' "$EXTRA_CA_CERTS" | cat /etc/ssl/certs/ca-certificates.crt - >/tmp/ca.pem \
        && export PIP_CERT=/tmp/ca.pem; fi \
    && pip install -r /tmp/requirements.txt \
    && rm -f /tmp/pyproject.toml /tmp/requirements.txt /tmp/ca.pem

# The package, from the build context (.dockerignore lets in only pyproject.toml, README.md, flamestream/, the
# service folders and examples/), then the examples in /app. The service folders are linked into the namespace
# (flamestream/fronts -> ../fronts, ...): `pip install` follows the links and installs them as flamestream.fronts etc.
COPY . /tmp/src
RUN pip install --no-deps --no-build-isolation /tmp/src \
    && mv /tmp/src/examples /app/examples \
    && rm -rf /tmp/src
