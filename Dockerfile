# One image for FlameStream nodes (`flamestream node` with the roles it hosts) and the CLI; docker-compose.yml
# picks the roles with the command. ZooKeeper runs from the official `zookeeper` image instead.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, so editing the sources does not reinstall them.
COPY pyproject.toml README.md ./
COPY flamestream/__init__.py flamestream/__init__.py
RUN pip install . && pip uninstall -y flamestream

COPY flamestream flamestream
COPY coordinator coordinator
COPY examples examples
COPY proto proto
COPY acker acker
COPY workers workers
COPY fronts fronts
COPY barrier barrier
# The service folders are linked into the namespace (flamestream/fronts -> ../fronts, ...), so the install
# below copies them as flamestream.fronts etc.; /app is where graph files such as examples/wordcount.py
# are resolved from.
RUN pip install --no-deps .

VOLUME ["/data"]
