--
-- PostgreSQL database dump
--

\restrict AbDpR2g1FtcO7N0kiFmSlQ2xSEA6KGJxl21lUgxUu3oXN6n4wjQnYKhp49Vevd4

-- Dumped from database version 15.18 (Debian 15.18-0+deb12u1)
-- Dumped by pg_dump version 15.18 (Debian 15.18-0+deb12u1)

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: controls; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.controls (
    experiment_id character varying(16) NOT NULL,
    key character varying(64) NOT NULL,
    value text NOT NULL
);


--
-- Name: experiment_updates; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.experiment_updates (
    id integer NOT NULL,
    experiment_id character varying(16) NOT NULL,
    field character varying(64) NOT NULL,
    value text NOT NULL,
    "time" double precision NOT NULL,
    via character varying(32) NOT NULL
);


--
-- Name: experiment_updates_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.experiment_updates_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: experiment_updates_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.experiment_updates_id_seq OWNED BY public.experiment_updates.id;


--
-- Name: experiments; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.experiments (
    id character varying(16) NOT NULL,
    name text,
    config text NOT NULL,
    config_path text,
    status character varying(24) NOT NULL,
    message text,
    start_time double precision,
    end_time double precision,
    controller_pid integer,
    next_sequence integer NOT NULL,
    optimize_mode character varying(8),
    best_trial character varying(16),
    pareto text,
    flow_run_id character varying(64),
    prefect_api text
);


--
-- Name: imported_data; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.imported_data (
    experiment_id character varying(16) NOT NULL,
    "position" integer NOT NULL,
    parameters text NOT NULL,
    raw text NOT NULL,
    value text NOT NULL,
    source text
);


--
-- Name: metrics; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.metrics (
    experiment_id character varying(16) NOT NULL,
    trial_id character varying(16) NOT NULL,
    type character varying(16) NOT NULL,
    sequence integer NOT NULL,
    value text NOT NULL,
    "time" double precision NOT NULL
);


--
-- Name: trial_events; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.trial_events (
    id integer NOT NULL,
    experiment_id character varying(16) NOT NULL,
    trial_id character varying(16) NOT NULL,
    status character varying(24) NOT NULL,
    "time" double precision NOT NULL,
    message text
);


--
-- Name: trial_events_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

CREATE SEQUENCE public.trial_events_id_seq
    AS integer
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;


--
-- Name: trial_events_id_seq; Type: SEQUENCE OWNED BY; Schema: public; Owner: -
--

ALTER SEQUENCE public.trial_events_id_seq OWNED BY public.trial_events.id;


--
-- Name: trialflow_schema; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.trialflow_schema (
    version integer NOT NULL
);


--
-- Name: trials; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.trials (
    experiment_id character varying(16) NOT NULL,
    id character varying(16) NOT NULL,
    sequence integer NOT NULL,
    parameter_id integer NOT NULL,
    parameters text NOT NULL,
    raw text NOT NULL,
    status character varying(24) NOT NULL,
    handle text,
    exit_code integer,
    message text,
    log_dir text,
    submit_time double precision NOT NULL,
    start_time double precision,
    end_time double precision,
    final text
);


--
-- Name: experiment_updates id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.experiment_updates ALTER COLUMN id SET DEFAULT nextval('public.experiment_updates_id_seq'::regclass);


--
-- Name: trial_events id; Type: DEFAULT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.trial_events ALTER COLUMN id SET DEFAULT nextval('public.trial_events_id_seq'::regclass);


--
-- Data for Name: controls; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.controls (experiment_id, key, value) FROM stdin;
shared01	trial_concurrency	3
shared01	stop	false
shared01	kill	["shaT3"]
shared01	elapsed_seconds	61.5
shared01	search_space	{"lr":{"_type":"loguniform","_value":[0.0001,0.1]},"layers":{"_type":"choice","_value":[1,2,3]}}
shared01	max_trial_number	5
shared02	trial_concurrency	3
shared02	stop	false
shared02	kill	["shaT3"]
shared02	elapsed_seconds	61.5
shared02	search_space	{"lr":{"_type":"loguniform","_value":[0.0001,0.1]},"layers":{"_type":"choice","_value":[1,2,3]}}
shared02	max_trial_number	5
\.


--
-- Data for Name: experiment_updates; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.experiment_updates (id, experiment_id, field, value, "time", via) FROM stdin;
1	shared01	max_trial_number	4	1790000091	trialflow update
2	shared01	max_trial_number	5	1790000092	trialflow resume
3	shared02	max_trial_number	4	1790000093	trialflow update
4	shared02	max_trial_number	5	1790000094	trialflow resume
\.


--
-- Data for Name: experiments; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.experiments (id, name, config, config_path, status, message, start_time, end_time, controller_pid, next_sequence, optimize_mode, best_trial, pareto, flow_run_id, prefect_api) FROM stdin;
shared02	shared02	{"experimentName":"asset","trialCommand":"python3 trial.py","trialCodeDirectory":"/work/code","trialConcurrency":2,"maxTrialNumber":5,"maxExperimentDuration":"1h","searchSpace":{"lr":{"_type":"loguniform","_value":[0.0001,0.1]},"layers":{"_type":"choice","_value":[1,2,3]}},"tuner":{"name":"TPE","classArgs":{"optimize_mode":"maximize"}},"assessor":{"name":"Medianstop","classArgs":{"optimize_mode":"maximize"}},"trainingService":{"platform":"local"}}	/work/config.yml	DONE	\N	1790000000	1790000100	\N	5	maximize	shaT4	\N	0f0e0d0c-0b0a-4909-8807-060504030201	http://127.0.0.1:4200/api
shared01	shared01	{"experimentName":"asset","trialCommand":"python3 trial.py","trialCodeDirectory":"/work/code","trialConcurrency":2,"maxTrialNumber":5,"maxExperimentDuration":"1h","searchSpace":{"lr":{"_type":"loguniform","_value":[0.0001,0.1]},"layers":{"_type":"choice","_value":[1,2,3]}},"tuner":{"name":"TPE","classArgs":{"optimize_mode":"maximize"}},"assessor":{"name":"Medianstop","classArgs":{"optimize_mode":"maximize"}},"trainingService":{"platform":"local"}}	/work/config.yml	DONE	\N	1790000000	1790000100	\N	5	maximize	shaT4	\N	0f0e0d0c-0b0a-4909-8807-060504030201	http://127.0.0.1:4200/api
\.


--
-- Data for Name: imported_data; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.imported_data (experiment_id, "position", parameters, raw, value, source) FROM stdin;
shared01	0	{"lr":0.01,"layers":2}	{"lr":0.01,"layers":1}	0.42	\N
shared01	1	{"lr":0.001,"layers":3}	{"lr":0.001,"layers":2}	{"default":0.37,"acc":0.9}	\N
shared01	2	{"lr":0.05,"layers":1}	{"lr":0.05,"layers":0}	0.3	warm0001
shared02	0	{"lr":0.01,"layers":2}	{"lr":0.01,"layers":1}	0.42	\N
shared02	1	{"lr":0.001,"layers":3}	{"lr":0.001,"layers":2}	{"default":0.37,"acc":0.9}	\N
shared02	2	{"lr":0.05,"layers":1}	{"lr":0.05,"layers":0}	0.3	warm0001
\.


--
-- Data for Name: metrics; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.metrics (experiment_id, trial_id, type, sequence, value, "time") FROM stdin;
shared01	shaT0	PERIODICAL	0	{"default":0.0,"loss":"nan"}	1790000002
shared01	shaT0	PERIODICAL	1	{"default":0.1,"loss":"nan"}	1790000003
shared01	shaT0	PERIODICAL	2	{"default":0.2,"loss":"nan"}	1790000004
shared01	shaT0	FINAL	0	0.5	1790000006
shared01	shaT1	PERIODICAL	0	{"default":0.1,"loss":"nan"}	1790000012
shared01	shaT1	PERIODICAL	1	{"default":0.2,"loss":"nan"}	1790000013
shared01	shaT1	PERIODICAL	2	{"default":0.30000000000000004,"loss":"nan"}	1790000014
shared01	shaT2	PERIODICAL	0	{"default":0.2,"loss":"nan"}	1790000022
shared01	shaT2	PERIODICAL	1	{"default":0.30000000000000004,"loss":"nan"}	1790000023
shared01	shaT2	PERIODICAL	2	{"default":0.4,"loss":"nan"}	1790000024
shared01	shaT3	PERIODICAL	0	{"default":0.30000000000000004,"loss":"nan"}	1790000032
shared01	shaT3	PERIODICAL	1	{"default":0.4,"loss":"nan"}	1790000033
shared01	shaT3	PERIODICAL	2	{"default":0.5,"loss":"nan"}	1790000034
shared01	shaT4	PERIODICAL	0	{"default":0.4,"loss":"nan"}	1790000042
shared01	shaT4	PERIODICAL	1	{"default":0.5,"loss":"nan"}	1790000043
shared01	shaT4	PERIODICAL	2	{"default":0.6000000000000001,"loss":"nan"}	1790000044
shared01	shaT4	FINAL	0	0.9	1790000046
shared02	shaT0	PERIODICAL	0	{"default":0.0,"loss":"nan"}	1790000002
shared02	shaT0	PERIODICAL	1	{"default":0.1,"loss":"nan"}	1790000003
shared02	shaT0	PERIODICAL	2	{"default":0.2,"loss":"nan"}	1790000004
shared02	shaT0	FINAL	0	0.5	1790000006
shared02	shaT1	PERIODICAL	0	{"default":0.1,"loss":"nan"}	1790000012
shared02	shaT1	PERIODICAL	1	{"default":0.2,"loss":"nan"}	1790000013
shared02	shaT1	PERIODICAL	2	{"default":0.30000000000000004,"loss":"nan"}	1790000014
shared02	shaT2	PERIODICAL	0	{"default":0.2,"loss":"nan"}	1790000022
shared02	shaT2	PERIODICAL	1	{"default":0.30000000000000004,"loss":"nan"}	1790000023
shared02	shaT2	PERIODICAL	2	{"default":0.4,"loss":"nan"}	1790000024
shared02	shaT3	PERIODICAL	0	{"default":0.30000000000000004,"loss":"nan"}	1790000032
shared02	shaT3	PERIODICAL	1	{"default":0.4,"loss":"nan"}	1790000033
shared02	shaT3	PERIODICAL	2	{"default":0.5,"loss":"nan"}	1790000034
shared02	shaT4	PERIODICAL	0	{"default":0.4,"loss":"nan"}	1790000042
shared02	shaT4	PERIODICAL	1	{"default":0.5,"loss":"nan"}	1790000043
shared02	shaT4	PERIODICAL	2	{"default":0.6000000000000001,"loss":"nan"}	1790000044
shared02	shaT4	FINAL	0	0.9	1790000046
\.


--
-- Data for Name: trial_events; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.trial_events (id, experiment_id, trial_id, status, "time", message) FROM stdin;
2	shared01	shaT0	RUNNING	1790000001	\N
3	shared01	shaT0	SUCCEEDED	1790000007	\N
5	shared01	shaT1	RUNNING	1790000011	\N
6	shared01	shaT1	FAILED	1790000017	exit code 3; stderr tail:\nboom ünïcode
8	shared01	shaT2	RUNNING	1790000021	\N
9	shared01	shaT2	EARLY_STOPPED	1790000027	stopped by the assessor
11	shared01	shaT3	RUNNING	1790000031	\N
12	shared01	shaT3	USER_CANCELED	1790000037	cancelled by the user
14	shared01	shaT4	RUNNING	1790000041	\N
15	shared01	shaT4	SUCCEEDED	1790000047	\N
18	shared02	shaT0	RUNNING	1790000001	\N
19	shared02	shaT0	SUCCEEDED	1790000007	\N
21	shared02	shaT1	RUNNING	1790000011	\N
22	shared02	shaT1	FAILED	1790000017	exit code 3; stderr tail:\nboom ünïcode
24	shared02	shaT2	RUNNING	1790000021	\N
25	shared02	shaT2	EARLY_STOPPED	1790000027	stopped by the assessor
27	shared02	shaT3	RUNNING	1790000031	\N
28	shared02	shaT3	USER_CANCELED	1790000037	cancelled by the user
30	shared02	shaT4	RUNNING	1790000041	\N
31	shared02	shaT4	SUCCEEDED	1790000047	\N
1	shared01	shaT0	WAITING	1790000000	\N
4	shared01	shaT1	WAITING	1790000010	\N
7	shared01	shaT2	WAITING	1790000020	\N
10	shared01	shaT3	WAITING	1790000030	\N
13	shared01	shaT4	WAITING	1790000040	\N
16	shared01	shaT1	FAILED	1790000019	resubmitted after an interruption (node lost)
17	shared02	shaT0	WAITING	1790000000	\N
20	shared02	shaT1	WAITING	1790000010	\N
23	shared02	shaT2	WAITING	1790000020	\N
26	shared02	shaT3	WAITING	1790000030	\N
29	shared02	shaT4	WAITING	1790000040	\N
32	shared02	shaT1	FAILED	1790000019	resubmitted after an interruption (node lost)
\.


--
-- Data for Name: trialflow_schema; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.trialflow_schema (version) FROM stdin;
3
\.


--
-- Data for Name: trials; Type: TABLE DATA; Schema: public; Owner: -
--

COPY public.trials (experiment_id, id, sequence, parameter_id, parameters, raw, status, handle, exit_code, message, log_dir, submit_time, start_time, end_time, final) FROM stdin;
shared02	shaT4	4	4	{"lr":1e-05,"layers":2}	{"lr":1e-05,"layers":1}	SUCCEEDED	{"trial_id":"shaT4","platform":"local","data":{"trial_dir":"/work/shared02/trials/shaT4","sequence":4}}	0	\N	/work/shared02/trials/shaT4	1790000040	1790000041	1790000047	0.9
shared02	shaT0	0	0	{"lr":0.1,"layers":1}	{"lr":0.1,"layers":0}	SUCCEEDED	{"trial_id":"shaT0","platform":"local","data":{"trial_dir":"/work/shared02/trials/shaT0","sequence":0}}	0	\N	/work/shared02/trials/shaT0	1790000000	1790000001	1790000007	0.5
shared01	shaT0	0	0	{"lr":0.1,"layers":1}	{"lr":0.1,"layers":0}	SUCCEEDED	{"trial_id":"shaT0","platform":"local","data":{"trial_dir":"/work/shared01/trials/shaT0","sequence":0}}	0	\N	/work/shared01/trials/shaT0	1790000000	1790000001	1790000007	0.5
shared01	shaT1	1	1	{"lr":0.01,"layers":2}	{"lr":0.01,"layers":1}	FAILED	{"trial_id":"shaT1","platform":"local","data":{"trial_dir":"/work/shared01/trials/shaT1","sequence":1}}	3	exit code 3; stderr tail:\nboom ünïcode	/work/shared01/trials/shaT1	1790000010	1790000011	1790000017	\N
shared02	shaT1	1	1	{"lr":0.01,"layers":2}	{"lr":0.01,"layers":1}	FAILED	{"trial_id":"shaT1","platform":"local","data":{"trial_dir":"/work/shared02/trials/shaT1","sequence":1}}	3	exit code 3; stderr tail:\nboom ünïcode	/work/shared02/trials/shaT1	1790000010	1790000011	1790000017	\N
shared01	shaT4	4	4	{"lr":1e-05,"layers":2}	{"lr":1e-05,"layers":1}	SUCCEEDED	{"trial_id":"shaT4","platform":"local","data":{"trial_dir":"/work/shared01/trials/shaT4","sequence":4}}	0	\N	/work/shared01/trials/shaT4	1790000040	1790000041	1790000047	0.9
shared01	shaT2	2	2	{"lr":0.001,"layers":3}	{"lr":0.001,"layers":2}	EARLY_STOPPED	{"trial_id":"shaT2","platform":"local","data":{"trial_dir":"/work/shared01/trials/shaT2","sequence":2}}	130	stopped by the assessor	/work/shared01/trials/shaT2	1790000020	1790000021	1790000028	\N
shared02	shaT2	2	2	{"lr":0.001,"layers":3}	{"lr":0.001,"layers":2}	EARLY_STOPPED	{"trial_id":"shaT2","platform":"local","data":{"trial_dir":"/work/shared02/trials/shaT2","sequence":2}}	130	stopped by the assessor	/work/shared02/trials/shaT2	1790000020	1790000021	1790000028	\N
shared01	shaT3	3	3	{"lr":0.0001,"layers":1}	{"lr":0.0001,"layers":0}	USER_CANCELED	{"trial_id":"shaT3","platform":"local","data":{"trial_dir":"/work/shared01/trials/shaT3","sequence":3}}	\N	cancelled by the user	/work/shared01/trials/shaT3	1790000030	1790000031	1790000038	\N
shared02	shaT3	3	3	{"lr":0.0001,"layers":1}	{"lr":0.0001,"layers":0}	USER_CANCELED	{"trial_id":"shaT3","platform":"local","data":{"trial_dir":"/work/shared02/trials/shaT3","sequence":3}}	\N	cancelled by the user	/work/shared02/trials/shaT3	1790000030	1790000031	1790000038	\N
\.


--
-- Name: experiment_updates_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.experiment_updates_id_seq', 4, true);


--
-- Name: trial_events_id_seq; Type: SEQUENCE SET; Schema: public; Owner: -
--

SELECT pg_catalog.setval('public.trial_events_id_seq', 32, true);


--
-- Name: controls controls_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.controls
    ADD CONSTRAINT controls_pkey PRIMARY KEY (experiment_id, key);


--
-- Name: experiment_updates experiment_updates_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.experiment_updates
    ADD CONSTRAINT experiment_updates_pkey PRIMARY KEY (id);


--
-- Name: experiments experiments_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.experiments
    ADD CONSTRAINT experiments_pkey PRIMARY KEY (id);


--
-- Name: imported_data imported_data_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.imported_data
    ADD CONSTRAINT imported_data_pkey PRIMARY KEY (experiment_id, "position");


--
-- Name: metrics metrics_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.metrics
    ADD CONSTRAINT metrics_pkey PRIMARY KEY (experiment_id, trial_id, type, sequence);


--
-- Name: trial_events trial_events_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.trial_events
    ADD CONSTRAINT trial_events_pkey PRIMARY KEY (id);


--
-- Name: trials trials_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.trials
    ADD CONSTRAINT trials_pkey PRIMARY KEY (experiment_id, id);


--
-- PostgreSQL database dump complete
--

\unrestrict AbDpR2g1FtcO7N0kiFmSlQ2xSEA6KGJxl21lUgxUu3oXN6n4wjQnYKhp49Vevd4

