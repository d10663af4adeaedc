# The orch8 engine and operator service (one image, the command picks the role).
FROM python:3.11-slim-bookworm
WORKDIR /app
COPY pyproject.toml README.md ./
COPY orch8_py ./orch8_py
COPY web ./web
COPY sql ./sql
RUN pip install --no-cache-dir . && useradd --system orch8
USER orch8
ENTRYPOINT ["orch8"]
