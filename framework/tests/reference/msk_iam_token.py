#!/usr/bin/env python3
"""Reference MSK IAM auth tokens for framework/src/kafka.rs's unit tests, computed with
botocore's SigV4QueryAuth exactly as AWS's aws-msk-iam-sasl-signer-python builds them
(presign GET https://kafka.<region>.amazonaws.com/?Action=kafka-cluster:Connect for the
service kafka-cluster, 900 s; then append User-Agent; base64url without padding), at a
fixed clock with static credentials. Independent of the Rust code under test.

    python3 -m venv /tmp/boto && /tmp/boto/bin/pip install 'botocore==1.40.76'
    /tmp/boto/bin/python framework/tests/reference/msk_iam_token.py
"""
import base64
import datetime
from unittest import mock

import botocore.auth
from botocore.auth import SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

FIXED = datetime.datetime(2024, 1, 2, 3, 4, 5)
USER_AGENT = "lambda-streams/test"


def token(region, credentials):
    with mock.patch.object(botocore.auth, "get_current_datetime", return_value=FIXED):
        request = AWSRequest(
            method="GET",
            url=f"https://kafka.{region}.amazonaws.com/",
            params={"Action": "kafka-cluster:Connect"},
        )
        SigV4QueryAuth(credentials, "kafka-cluster", region, expires=900).add_auth(request)
        request.params = {"User-Agent": USER_AGENT}
        url = request.prepare().url
    return url, base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


cases = {
    "without_session_token": ("us-east-1", Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")),
    "with_session_token": (
        "eu-west-3",
        Credentials("ASIAEXAMPLE", "secret/with+slash=", "IQoJb3JpZ2luX2VjEXAMPLE/+=token"),
    ),
}
for name, (region, credentials) in cases.items():
    url, encoded = token(region, credentials)
    print(f"{name}:\n  url   {url}\n  token {encoded}")
